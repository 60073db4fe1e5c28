"""Render conformance JSON artifacts (``dsv4ops check --json``) as Markdown, and the
"verified where" table from all of them: ``python -m dsv4ops.conformance.report docs/conformance``."""
from __future__ import annotations

import json
import sys
from pathlib import Path

from .._table import render_table
from . import LEGEND, summarize


def render(data: dict) -> str:
    meta, results = data["meta"], data["results"]
    cells = summarize(results)
    backends = sorted({b for b, _ in cells})
    ops = list(dict.fromkeys(r["op"] for r in results))
    rows = [(b, *(cells[(b, op)].text if (b, op) in cells else "-" for op in ops)) for b in backends]
    libs = ", ".join(f"{v}" for v in meta.get("libraries", {}).values())
    lines = [f"# Conformance on {meta['device']}", "",
             f"- date: {meta['date']}", f"- platform: {meta['platform']}", f"- tier: {meta['tier']}, seed {meta['seed']}",
             f"- libraries: {libs}", f"- command: `{meta['command']}`", "",
             LEGEND, "",
             "```", render_table(("backend", *ops), rows), "```"]
    failures = [r for r in results if r["status"] in ("fail", "error")]
    if failures:
        lines += ["", "## Failures", ""] + [f"- {r['backend']} `{r['case']}`: {r['message']}" for r in failures]
    return "\n".join(lines) + "\n"


def verified_table(folder: Path) -> str:
    rows = []
    for path in sorted(folder.glob("*.json")):
        data = json.loads(path.read_text())
        for (backend, op), cell in sorted(summarize(data["results"]).items()):
            if cell.passed or cell.failed or cell.errors:
                rows.append((backend, op, data["meta"]["device"], data["meta"]["tier"], cell.text, path.name))
    return ("# What was verified where\n\nGenerated from `docs/conformance/*.json` by "
            "`python -m dsv4ops.conformance.report docs/conformance`. The reference and the Triton backend "
            "(interpreter) also run the quick tier in CI on every change. The vendor adapters listed after this "
            "table have not run on hardware: contract tests exercise them in CI (the adapter code against "
            "fakes of the vendors' kernels, on simulated platforms), some also against the signatures of an "
            "installed release. Anything not listed is unverified.\n\n"
            "```\n" + render_table(("backend", "op", "device", "tier", "result", "artifact"), rows) + "\n```\n\n"
            + CONTRACT_ONLY + TRITON_SOFTWARE_FP8)


# (backend, op) pairs not run on hardware here, and how they were checked instead.
CONTRACT_ONLY = """## Verified without a hardware run

`tests/test_vendor_contracts.py` and `tests/test_vendor_deepselect.py` run each adapter on simulated
platforms against fakes in `tests/fakes/` built from the vendor's source, which carry its released
parameter lists; the adapter's recorded calls are bound to those signatures. How, per pair:
`fake` = those contract tests only; `fake + signatures (CI)` = also bound to the signatures of the
newest release, which CI's drift step (`.ci/run`) installs on a CPU machine (FlashInfer imported,
DeepSelect read from the installed `deep_select/interface.py`: it imports only with a CUDA torch).

```
backend     op                    how                      vendor entry point (release)
----------  --------------------  -----------------------  --------------------------------------------------------
aiter       sparse_mla_decode     fake                     pa_decode_sparse (AITER >= 0.1.20 on gfx950, >= 0.1.17 on gfx942)
aiter       indexer_topk          fake                     top_k_per_row_decode / top_k_per_row_prefill (AITER >= 0.1.15)
aiter       mqa_logits            fake                     fp8_mqa_logits (AITER >= 0.1.15)
aiter       sparse_mla_prefill    fake                     pa_prefill_sparse (AITER >= 0.1.20, gfx950)
deepselect  indexer_topk          fake + signatures (CI)   deep_select.topk (tokenspeed-deepselect 1.0.0.post20260910; sm100/103)
flashinfer  sparse_mla_decode     fake + signatures (CI)   TRTLLM-gen DSV4 decode (sm100/103/107), MODEL1 decode (sm120/121) (0.7.2.post1)
flashinfer  indexer_topk          fake + signatures (CI)   top_k_ragged_transform (flashinfer-python 0.7.2.post1)
xpu         qnorm_rope_kv_insert  fake                     torch.ops._xpu_C.deepseek_qnorm_rope_kv_insert (bf16 layout; vllm-xpu-kernels >= 0.1.11)
xpu         paged_mqa_logits      fake                     torch.ops._xpu_C.fp8_paged_mqa_logits (Xe2, block size 64; >= 0.1.8)
xpu         indexer_topk          fake                     torch.ops._C.top_k_per_row_prefill (vllm-xpu-kernels >= 0.1.7)
```
"""

TRITON_SOFTWARE_FP8 = """
## The Triton backend's software fp8 path

The GPUs without FP8 tensor cores (CUDA sm80 / sm86: A100, A800, RTX 30; ROCm gfx90a, gfx1100 and
other AMD GPUs without FP8 MMA) run the Triton kernels' software fp8 path (docs/backends.md). It is
**compile-verified, not run on that hardware**: `tests/compile_only.py` compiles every quick-tier
case of every op for cuda:sm80, sm86 and rocm:gfx90a, gfx1100 (CI); CI runs the quick tier through
the path under the interpreter and checks that its writers write the FP8 path's bytes
(`tests/test_fp8_paths.py`). The hardware stand-in, the full tier with the path forced on the H100
(`tools/run_fp8_paths.sh`), has not run yet; its artifact will be listed in the table above.
"""


def main(argv=None) -> int:
    folder = Path((argv or sys.argv[1:] or ["docs/conformance"])[0])
    for path in sorted(folder.glob("*.json")):
        path.with_suffix(".md").write_text(render(json.loads(path.read_text())))
    (folder.parent / "verified.md").write_text(verified_table(folder))
    return 0


if __name__ == "__main__":
    sys.exit(main())
