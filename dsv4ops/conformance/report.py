"""The "verified where" table (docs/verified.md) from the conformance JSON artifacts (``dsv4ops check
--json``) of a folder: ``python -m dsv4ops.conformance.report docs/conformance``."""
from __future__ import annotations

import json
import sys
import textwrap
from pathlib import Path

from .._table import render_table
from . import summarize


def verified_table(folder: Path) -> str:
    rows, libraries = [], {}
    artifacts = sorted(folder.glob("*.json"))
    for path in artifacts:
        data = json.loads(path.read_text())
        for (backend, op), cell in sorted(summarize(data["results"]).items()):
            if cell.passed or cell.failed or cell.errors:
                rows.append((backend, op, data["meta"]["device"], data["meta"]["tier"], cell.text, path.name))
        for release in data["meta"].get("libraries", {}).values():
            libraries.setdefault(release, []).append(path.name)
    return ("# What was verified where\n\nGenerated from `docs/conformance/*.json` by "
            "`python -m dsv4ops.conformance.report docs/conformance`. The reference and the Triton backend "
            "(interpreter) also run the quick tier in CI on every change. The vendor adapters listed after this "
            "table have not run on hardware: contract tests exercise them in CI (the adapter code against "
            "fakes of the vendors' kernels, on simulated platforms), some also against the signatures of an "
            "installed release. Anything not listed is unverified.\n\n"
            "```\n" + render_table(("backend", "op", "device", "tier", "result", "artifact"), rows) + "\n```\n\n"
            + textwrap.fill("Releases installed in those runs (from the artifacts): " + "; ".join(
                f"{release} ({'every artifact' if len(names) == len(artifacts) else ', '.join(names)})"
                for release, names in libraries.items()) + ".", 100) + "\n\n"
            + CONTRACT_ONLY + TRITON_SOFTWARE_FP8)


# (backend, op) pairs not run on hardware here, and how they were checked instead.
CONTRACT_ONLY = """## Verified without a hardware run

`tests/test_vendor_contracts.py` and `tests/test_vendor_deepselect.py` run each adapter on simulated
platforms against fakes in `tests/fakes/` built from the vendor's source, which carry its released
parameter lists; the adapter's recorded calls are bound to those signatures. How, per pair:
`fake` = those contract tests only; `fake + signatures (CI)` = also bound to the signatures of the
newest release, which CI's drift step (`.ci/run`) installs on a CPU machine (FlashInfer imported,
DeepSelect read from the installed `deep_select/interface.py`: it imports only with a CUDA torch);
`fake + wheel signatures (CI)` = bound to the signatures declared in the wheels CI's drift step
downloads without installing (`tests/test_vendor_wheels.py`: DeepGEMM's `_C.pyi`, FlashMLA's interface).
The DeepGEMM and FlashMLA rows are the generations newer than the ones run on the H100 above
(tokenspeed-deepgemm 2.5.0.post20260604, tokenspeed-flashmla 1.0.0.post20260615, which CI's wheel check
also covers); they are built for torch 2.14 (builds newer than those did not import next to the
H100's torch 2.11), so they have not run on hardware.

```
backend     op                    how                      vendor entry point (release)
----------  --------------------  -----------------------  --------------------------------------------------------
aiter       sparse_mla_decode     fake                     pa_decode_sparse (AITER >= 0.1.20 on gfx950, >= 0.1.17 on gfx942)
aiter       indexer_topk          fake                     top_k_per_row_decode / top_k_per_row_prefill (AITER >= 0.1.15)
aiter       mqa_logits            fake                     fp8_mqa_logits (AITER >= 0.1.15)
aiter       sparse_mla_prefill    fake                     pa_prefill_sparse (AITER >= 0.1.20, gfx950)
deepgemm    paged_mqa_logits      fake + wheel signatures  API 2.8: fp8_fp4_paged_mqa_logits (tokenspeed-deepgemm 2.8.2.post20261020; sm90)
deepgemm    mqa_logits            fake + wheel signatures  API 2.8: fp8_fp4_mqa_logits, compressed rows (2.8.2.post20261020; sm90)
deepgemm    fp8_einsum            fake + wheel signatures  API 2.8: fp8_einsum (tokenspeed-deepgemm 2.8.2.post20261020; sm90)
deepgemm    fp8_einsum            fake                     API 2.8.0 / 2.8 on sm100/103: 32-wide scale blocks, recipe (1, 32, 32) (SM90 declines them)
deepgemm    paged_mqa_logits      fake                     API 2.8.0: 2.5's call of fp8_fp4_paged_mqa_logits (tokenspeed-deepgemm 2.8.0.post20260924; sm90)
deepgemm    mqa_logits            fake                     API 2.8.0: 2.5's call of fp8_fp4_mqa_logits, clean_logits (2.8.0.post20260924; sm90)
deepselect  indexer_topk          fake + signatures (CI)   deep_select.topk (tokenspeed-deepselect 1.0.0.post20260910; sm100/103)
flashmla    sparse_mla_decode     wheel signatures (CI)    flash_mla_with_kvcache (tokenspeed-flashmla 1.0.0.post20260924: unchanged)
flashmla    sparse_mla_prefill    fake + wheel signatures  flash_mla_sparse_fwd (tokenspeed-flashmla 1.0.0.post20260924: unchanged)
flashmla    sparse_mla_prefill    fake                     V4.1 caches declined on every arch: no prefill entry of 1.0.0.post20260924 reads 528 / 288 B records (flash_mla_sparse_fwd takes bf16 kv); inline generation: sm100/103 only
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
    (folder.parent / "verified.md").write_text(verified_table(folder))
    return 0


if __name__ == "__main__":
    sys.exit(main())
