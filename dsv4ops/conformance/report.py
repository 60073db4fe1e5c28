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
            "(interpreter) also run the quick tier in CI on every change. The flashinfer and aiter adapters "
            "are exercised only by contract tests in CI (tests/test_vendor_contracts.py: the adapter code "
            "against fakes of the vendors' documented semantics, on simulated platforms); they have not run "
            "on hardware. Anything not listed is unverified.\n\n"
            "```\n" + render_table(("backend", "op", "device", "tier", "result", "artifact"), rows) + "\n```\n\n"
            + CONTRACT_ONLY)


# (backend, op) pairs verified only against fakes of the vendor's released API (no such hardware here).
CONTRACT_ONLY = """## Verified by contract tests only (no hardware run)

`tests/test_vendor_contracts.py` runs each adapter on simulated platforms against fakes in `tests/fakes/`
that carry the vendor's released parameter lists; the adapter's recorded calls are bound to those
signatures (and to the installed package's real signatures wherever it installs: never on the CI machine).

```
backend     op                    vendor entry point (release)
----------  --------------------  ------------------------------------------------------------
aiter       sparse_mla_decode     aiter pa_decode_sparse (AITER >= 0.1.20 on gfx950, >= 0.1.17 on gfx942)
aiter       indexer_topk          aiter top_k_per_row_decode / top_k_per_row_prefill (AITER >= 0.1.15)
flashinfer  sparse_mla_decode     flashinfer 0.7.2.post1 TRTLLM-gen DSV4 decode (sm100/103/107), MODEL1 decode (sm120/121)
flashinfer  indexer_topk          flashinfer 0.7.2.post1 ragged top-k
xpu         qnorm_rope_kv_insert  vllm-xpu-kernels torch.ops._xpu_C.deepseek_qnorm_rope_kv_insert (bf16 layout)
xpu         paged_mqa_logits      vllm-xpu-kernels torch.ops._xpu_C.fp8_paged_mqa_logits (Xe2, block size 64)
xpu         indexer_topk          vllm-xpu-kernels torch.ops._C.top_k_per_row_prefill
```
"""


def main(argv=None) -> int:
    folder = Path((argv or sys.argv[1:] or ["docs/conformance"])[0])
    for path in sorted(folder.glob("*.json")):
        path.with_suffix(".md").write_text(render(json.loads(path.read_text())))
    (folder.parent / "verified.md").write_text(verified_table(folder))
    return 0


if __name__ == "__main__":
    sys.exit(main())
