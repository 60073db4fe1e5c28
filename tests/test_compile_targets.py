"""The Triton kernels compile for the GPUs they serve, checked on this CPU machine (see
tests/compile_only.py: the interpreter that runs them in CI never invokes Triton's compiler)."""
import concurrent.futures
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from dsv4ops import registry
from dsv4ops.ops import OP_NAMES

SCRIPT = Path(__file__).with_name("compile_only.py")
TRITON = Path(__file__).resolve().parent.parent / "backends" / "triton"


def launched_kernels() -> set[str]:
    """Every ``@triton.jit`` function of the Triton backend that its wrappers launch (``name[grid](``)."""
    source = "\n".join(path.read_text() for path in TRITON.glob("*.py"))
    jitted = set(re.findall(r"@triton\.jit[^\n]*\n(?:@[^\n]*\n)*def (\w+)", source))
    launched = set(re.findall(r"(\w+)\[[^\]\n]+\]\(", source))
    return jitted & launched


KERNELS = launched_kernels()
# Launched by the software fp8 path only (its one decode per call of an fp8 operand, common.py).
SOFTWARE_PATH_KERNELS = {"_e4m3_decode_kernel"}


def test_the_kernel_list_is_found():
    assert {"_decode_kernel", "_fp8_einsum_kernel", "_indexer_topk_kernel", "_qnorm_rope_kv_insert_kernel"} <= KERNELS


# The GPUs without FP8 tensor cores, served by the software fp8 path (backends/triton/__init__.py).
SOFTWARE_FP8 = ("cuda:sm75", "cuda:sm80", "cuda:sm86", "rocm:gfx90a", "rocm:gfx1100")
TARGETS = (*SOFTWARE_FP8, "cuda:sm89", "cuda:sm90", "cuda:sm120", "rocm:gfx942")
DECLINED = {"cuda:sm75": {"sparse_mla_decode", "sparse_mla_prefill"}}    # bf16 tensor cores from sm80
SOFTWARE_IMPL = "triton (fp8 in software)"
# The ops with fp8 operands, which the Triton backend registers twice (the software path too).
WITH_SOFTWARE_PATH = {op for op in OP_NAMES if any(i.name == SOFTWARE_IMPL for i in registry.implementations(op))}


# Kernel families the default tunables do not pick: compiled in a second run over their ops' cases.
OTHER_FAMILIES = ("--tuning", "fused_path=stream", "--ops", "paged_mqa_topk,mqa_topk")


@pytest.fixture(scope="module")
def compiled():
    """Every target's compile-only runs (the defaults, then ``OTHER_FAMILIES``), started together on
    as many workers as there are cores (each run is one CPU-bound process), awaited by the test of
    its target."""
    env = {k: v for k, v in os.environ.items() if k not in ("TRITON_INTERPRET", "DSV4OPS_TRITON_TUNING")}
    run = lambda target, *extra: subprocess.run([sys.executable, str(SCRIPT), target, *extra], capture_output=True,
                                                text=True, env=env, timeout=2400)
    with concurrent.futures.ThreadPoolExecutor(max_workers=os.cpu_count() or 1) as pool:
        futures = {target: (pool.submit(run, target), pool.submit(run, target, *OTHER_FAMILIES)) for target in TARGETS}
        yield futures


@pytest.mark.slow
@pytest.mark.parametrize("target", TARGETS)
def test_every_kernel_compiles_for(compiled, target):
    """Every kernel compiles, every op has compiled cases (no op only declined, but for what the
    platform cannot do), and each op runs the fp8 path its platform should."""
    run, other = (future.result() for future in compiled[target])
    for r in (run, other):
        assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-4000:]
    kernels = set()
    for r in (run, other):
        line = next(l for l in r.stdout.splitlines() if l.startswith("compiled for"))
        kernels |= set(line.split(":", 2)[-1].split())
    served = set(OP_NAMES) - DECLINED.get(target, set())
    if target not in DECLINED:
        expected = KERNELS if target in SOFTWARE_FP8 else KERNELS - SOFTWARE_PATH_KERNELS
        assert expected <= kernels, sorted(expected - kernels)
    paths = set(re.findall(r"^cases (\w+) \[(.+)\]: \d+$", run.stdout, re.M))
    assert {op for op, _ in paths} == served, run.stdout[-4000:]
    software = {op for op, impl in paths if impl == SOFTWARE_IMPL}
    assert software == (served & WITH_SOFTWARE_PATH if target in SOFTWARE_FP8 else set()), paths


def compile_sm90(asm_dir: Path, op: str, *options: str):
    """Compile ``op``'s conformance cases for sm90 with the defaults' tiles, PTX into ``asm_dir``."""
    env = {k: v for k, v in os.environ.items() if k not in ("TRITON_INTERPRET", "DSV4OPS_TRITON_TUNING")}
    run = subprocess.run([sys.executable, str(SCRIPT), "cuda:sm90", "--ops", op, *options, "--asm", str(asm_dir)],
                         capture_output=True, text=True, env=env, timeout=1200)
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-4000:]


def compiled_variants(asm_dir: Path, kernel: str) -> list[str]:
    """The PTX of each compiled variant of ``kernel`` (at least one)."""
    codes = [path.read_text() for path in asm_dir.glob(f"{kernel}.*.s")]
    assert codes, f"no {kernel} variant compiled"
    return codes


@pytest.mark.slow
def test_topk_rows_load_in_16_byte_vectors(tmp_path):
    """At the production shapes (indexer_topk's full tier, compiled for sm90) the one-program top-k
    selection, the threshold path's sample and its filter read the logits in 16-byte vectors
    (``indexer_topk._piece``, ``threshold_topk.sample_columns``: load masks constant over 16
    columns); a mask ending at the row's own end compiles to one 4-byte load per key."""
    compile_sm90(tmp_path, "indexer_topk", "--tier", "full")
    for kernel in ("_indexer_topk_kernel", "_threshold_kernel", "_filter_kernel"):
        codes = compiled_variants(tmp_path, kernel)
        assert any("ld.global.v4.b32" in code for code in codes), f"no {kernel} variant loads 16-byte vectors"


@pytest.mark.slow
def test_decode_warpgroups_split_the_scores(tmp_path):
    """sm90, 64 heads per program on 8 warps: the two warpgroups split each step's score product
    ``[64, 512] x [512, rows]`` (each issues wgmma of ``rows / 2`` columns over the 32 slices of 16 of
    the 512), rather than each computing all of it, which is how Triton lays out a product whose result
    feeds another product (sparse_mla_decode._attend_block computes the scores in a branch of their own
    to avoid that). Per step, the output product issues ``rows / 16`` m64n256k16."""
    compile_sm90(tmp_path, "sparse_mla_decode")
    for code in compiled_variants(tmp_path, "_decode_kernel"):
        shapes = re.findall(r"wgmma\.mma_async\.sync\.aligned\.m64n(\d+)k16", code)
        output = shapes.count("256")
        score_columns = sum(int(n) for n in shapes if n != "256")
        assert output and score_columns == 32 * 8 * output, (output, score_columns)
