"""The "verified where" table (docs/verified.md) from the conformance JSON artifacts (``dsv4ops check
--json``) of a folder: ``python -m dsv4ops.conformance.report docs/conformance``."""
from __future__ import annotations

import json
import sys
import textwrap
from pathlib import Path

from .._table import render_table
from ..ops import OP_NAMES
from . import summarize, versions
from .cases import cases

WIDTH = 100


def verified_table(folder: Path) -> str:
    """docs/verified.md's text from the artifacts of ``folder`` (and its versions.json)."""
    derived = versions.load_versions(folder)
    artifacts = versions.artifacts(folder)
    runs, rows, stale, reference_cases = [], [], [], 0
    for path in artifacts:
        meta, results = (data := json.loads(path.read_text()))["meta"], data["results"]
        recorded = meta.get("sources", derived.get(path.name, {}).get("sources"))
        commit = meta.get("commit", derived.get(path.name, {}).get("commit", "unknown"))
        forced = ", ".join(f"{k}={v}" for k, v in sorted(meta.get("settings", {}).items())) or "-"
        runs.append((path.name, meta["device"], meta["tier"], meta["date"][:10], commit, forced))
        for (backend, op), cell in sorted(summarize(results).items()):
            ran = cell.passed + cell.failed + cell.errors
            if backend == "reference":
                reference_cases += ran
            elif ran:
                version, state, changed = row_version(backend, op, recorded)
                rows.append((backend, op, meta["device"].removeprefix("NVIDIA "), cell.text, version, state,
                             path.name))
                stale += [f"{path.name} {backend} {op}: {', '.join(changed)}"] if changed else []
    return "".join((
        INTRO,
        _section("Runs", ("artifact", "device", "tier", "date", "commit", "forced"), runs, RUNS_NOTE),
        _section("Rows", ("backend", "op", "device", "result", "kernels", "now", "artifact"), rows, ROWS_NOTE),
        "Stale rows and their files changed since the run (`backends/` omitted):\n\n",
        "".join(f"- {line}\n" for line in stale or ["none"]) + "\n",
        _paragraph(f"Reference only: {quick_cases() + reference_cases} cases (the reference compared with itself: "
                   f"not verification): the {quick_cases()} quick-tier cases `dsv4ops check --include-reference` "
                   f"adds" + (f" and {reference_cases} of the artifacts above" if reference_cases else "")
                   + "; none of them is counted above."),
        _paragraph("Releases installed in those runs (from the artifacts): " + _releases(artifacts) + "."),
        CONTRACT_ONLY, TRITON_SOFTWARE_FP8))


def _section(title: str, header: tuple[str, ...], rows: list[tuple], note: str) -> str:
    return f"## {title}\n\n```\n{render_table(header, rows)}\n```\n\n" + _paragraph(note)


def _paragraph(text: str) -> str:
    return textwrap.fill(text, WIDTH) + "\n\n"


def _releases(artifacts: list[Path]) -> str:
    """Each library release the artifacts record, with the artifacts that ran it."""
    runs = {}
    for path in artifacts:
        for release in json.loads(path.read_text())["meta"].get("libraries", {}).values():
            runs.setdefault(release, []).append(path.name)
    return "; ".join(f"{release} ({'every artifact' if len(names) == len(artifacts) else ', '.join(names)})"
                     for release, names in runs.items())


def row_version(backend: str, op: str, recorded: dict | None) -> tuple[str, str, list[str]]:
    """(kernel version the row verified, "current" / "stale" / "unknown", the files changed since) for
    ``backend``'s ``op`` given a run's recorded file hashes (None: the run recorded none)."""
    files = versions.implementation_files(backend, op)
    if recorded is None or not files:
        return "unknown", "unknown", []
    then = {path: recorded.get(path) for path in files}
    changed = [path.removeprefix("backends/") for path, digest in versions.source_hashes(files).items()
               if then[path] != digest]
    return versions.kernel_version(then), "stale" if changed else "current", changed


def quick_cases() -> int:
    return sum(len(cases(op, "quick")) for op in OP_NAMES)


INTRO = """# What was verified where

Generated from `docs/conformance/*.json` by `python -m dsv4ops.conformance.report docs/conformance`:
each run on a GPU (`dsv4ops check --json`), then each (backend, op) it verified, with the version of
the kernels it verified and whether today's sources are still that version. The Triton backend
(interpreter) and the composed backend also run the quick tier in CI on every change. The vendor
adapters listed after the rows have not run on hardware: contract tests exercise them in CI (the
adapter code against fakes of the vendors' kernels, on simulated platforms), some also against the
signatures of an installed release. Anything not listed is unverified.

"""

RUNS_NOTE = (
    "commit: the commit the run recorded (`dsv4ops check --json` writes it, `-dirty` when the checkout "
    "differed from it); for artifacts that record none, the commit that recorded the artifact "
    "(`docs/conformance/versions.json`, written from git history by `python -m dsv4ops.conformance.versions "
    "docs/conformance`), the nearest the history comes to the run's sources. forced: the settings that chose "
    "a backend or a kernel path in that run (DSV4OPS_BACKEND, DSV4OPS_PLATFORM, DSV4OPS_TRITON_TUNING, "
    "DSV4OPS_TUNING_TABLE).")

ROWS_NOTE = (
    "result: as `dsv4ops check` prints it (pass N: N cases matched the reference; (W): the worst case's error "
    "in units of the op's tolerance; M declined: cases the backend cannot serve there). kernels: a hash over "
    "the sources of the backend's implementation of the op as they were in that run (its module and the "
    "backend modules it imports, `dsv4ops.conformance.versions`); now: current where today's sources hash "
    "the same, stale where a file changed since (listed below), unknown where the run recorded nothing. A "
    "stale row verified earlier sources: a change of a listed file need not have touched the kernel (a "
    "warm-up helper added, say); `git diff <commit> -- <files>` tells. The composed backend's version covers its composition, its parts' "
    "kernels are those of the other rows.")


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
(`tools/run_fp8_paths.sh`: `DSV4OPS_TRITON_TUNING=fp8_path=soft`), ran over every op on 2026-11-26
(`H100-fp8-software.json`) and for the compressor again on 2026-11-27 (`H100-compress-fp8soft.json`);
the runs and rows above say which of their kernels have changed since.
"""


def main(argv=None) -> int:
    folder = Path((argv or sys.argv[1:] or ["docs/conformance"])[0])
    (folder.parent / "verified.md").write_text(verified_table(folder), encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
