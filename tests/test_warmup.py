"""The warm-up set is closed (issue #31): on this CPU machine, with the compile-only driver for sm90
(tests/compile_only.py), the variants ``dsv4ops.warmup`` compiles for V4-Flash dims and a set of
engine limits include every variant a sweep of shapes within those limits asks for (T = 1..40,
rows 1..40, contexts growing one token at a time, widths up to the limit). A call's variants are
Triton's own keys, computed by the launch path (``dsv4ops.warm_up.variant_keys``), so the test
cannot drift from the launchers. Runs in a subprocess: the kernels must be imported compiled, not
interpreted (the conftest sets TRITON_INTERPRET=1)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from dsv4ops import warm_up as W
from dsv4ops.errors import InputError
from dsv4ops.ops import OP_NAMES

# fp8_einsum's D and R are fixed per model (V4's are 1024 and 4096); smaller ones keep its CPU inputs small.
DIMS = dict(o_lora_rank=256, o_group_k=512)
LIMITS = dict(max_tokens=64, max_context=16384, next_n=2)


def sweeps(lim: W.Limits, dims: W.ModelDims) -> dict[str, list[dict]]:
    """Builder parameters of the calls an engine within ``lim`` makes, per op: sizes that change
    every step, one at a time (the issue's table, at CPU scale)."""
    H, ih, k, n = dims.heads, dims.index_heads, dims.index_topk, lim.next_n
    width = lim.index_width
    grow = [int(16 * 1.25 ** i) for i in range(40) if 16 * 1.25 ** i <= width] + [width]
    attention = [dict(T=T, H=H, topk=dims.window, layout="fp8_ds_mla", block_size=lim.swa_block,
                      extra_topk=k, extra_block_size=lim.c4_block) for T in range(1, 41)]
    attention += [dict(T=T, H=H, topk=dims.window, layout="fp8_ds_mla", block_size=lim.swa_block,
                       extra_topk=c, extra_block_size=lim.c128_block) for T, c in ((1, 1), (3, 17), (8, 100), (33, 128))]
    attention += [dict(T=T, H=H, topk=dims.window, layout="fp8_ds_mla", block_size=lim.swa_block) for T in (1, 5, 40)]
    topk = [dict(R=R, W=W_, k=k, mode="ranges") for R in range(1, 41) for W_ in (R * 97 % width + 1, width)]
    topk += [dict(R=4, W=w, k=k, mode=m, next_n=n) for w in range(3000, 3041) for m in ("decode1d", "decode2d")]
    topk += [dict(R=R, W=w, k=k, mode=m, next_n=n) for w in grow for R, m in ((2, "ranges"), (40, "decode2d"))]
    return {
        "qnorm_rope_kv_insert": [dict(T=T, H=H, layout="fp8_ds_mla", block_size=lim.swa_block, num_blocks=2)
                                 for T in range(1, 41)],
        "sparse_mla_decode": attention,
        "sparse_mla_prefill": attention[::3],
        "paged_mqa_logits": [dict(B=B, next_n=n, context=c, H=ih, block_size=lim.c4_block, lens_dim=d, clean=cl)
                             for B, c in zip(range(1, 21), range(256, 4000, 187)) for d, cl in ((1, B % 2 == 0), (2, B % 3 == 0))],
        "mqa_logits": [dict(T=T, S=S, H=ih, clean=T % 2 == 0) for T, S in zip(range(1, 31), range(64, 4097, 139))],
        "fp8_einsum": [dict(B=B, H=dims.o_groups, D=dims.o_lora_rank, R=dims.o_group_k, group_major=g)
                       for B in (*range(1, 21), 64, 127, 1024) for g in (False, True)],
        "indexer_topk": topk,
        "compress_kv_insert": [dict(layout=lay, ratio=r, block_size=bs, reqs=((p, t),), decode=d)
                               for lay, r, bs in (("fp8_ds_mla", 4, lim.c4_block), ("index_fp8", 4, lim.c4_block),
                                                  ("fp8_ds_mla", 128, lim.c128_block))
                               for p, t, d in ((0, 1, 0), (3, 5, 2), (0, 40, 0), (17, 23, 7), (200, 129, 0))],
        "inv_rope_fp8_quant": [dict(T=T, H=H, n_groups=dims.o_groups) for T in range(1, 41)],
        "mqa_topk": [dict(T=T, S=S, H=ih, topk=k) for T, S in zip(range(1, 31), range(k, width + 1, 131))],
        "paged_mqa_topk": [dict(B=B, next_n=n, context=c, H=ih, block_size=lim.c4_block, topk=k)
                           for B, c in zip(range(1, 21), range(600, width + 1, 173))],
    }


def main(argv) -> int:
    """Warm up for sm90 (compiling, without a GPU), then sweep: print per op the warmed variants,
    the sweep's calls, and the variants it asked for outside the warm-up's (as JSON)."""
    os.environ.pop("TRITON_INTERPRET", None)
    sys.path.insert(0, str(Path(__file__).parent))
    from compile_only import TARGETS, CompileOnlyDriver
    from triton.runtime import driver

    driver.set_active(CompileOnlyDriver(TARGETS["cuda:sm90"]))
    import torch

    import dsv4ops
    from dsv4ops import registry
    from dsv4ops.ops import OPS

    triton = registry.get_backend("triton")
    for op in OP_NAMES:
        triton.implementations[op][0].fn          # the kernels, compiled (not interpreted)
    declines = registry.Implementation.decline_reason

    def as_on_the_gpu(impl, plat, key):
        """The Triton backend declines CPU tensors unless interpreted: decide as dispatch would on sm90."""
        os.environ["TRITON_INTERPRET"] = "1"
        try:
            return declines(impl, plat, key)
        finally:
            del os.environ["TRITON_INTERPRET"]

    registry.Implementation.decline_reason = as_on_the_gpu
    report = {}
    with dsv4ops.simulate_platform("cuda", "sm90") as plat:
        summary = dsv4ops.warmup(dims=DIMS, limits=LIMITS, device="cpu", backends=["triton"], workers=2)
        dims, lim = W.model_dims(**DIMS), W.engine_limits(**LIMITS)
        gen = torch.Generator().manual_seed(1)
        for op, calls in sweeps(lim, dims).items():
            impls = triton.implementations[op]
            outside: set = set()
            for params in calls:
                call = OPS[op].validate_call(**OPS[op].spec.conformance.inputs("cpu", gen, **params))
                impl = next(i for i in impls if i.decline_reason(plat, call.key) is None)
                with W._compile_without_launching():     # warmed variants return without launching
                    outside |= W.variant_keys(lambda impl=impl, call=call: impl.bound(plat)(call.args))
            warmed = next(o for o in summary.ops if o.op == op)
            report[op] = dict(warmed=warmed.compiled, calls=len(calls), outside=sorted(map(list, outside)))
    for o in summary.ops:                                  # the ops not swept (W.NOT_ENUMERATED)
        report.setdefault(o.op, dict(warmed=o.compiled, calls=0, outside=[]))
    report["summary"] = dict(variants=len(summary.variants), seconds=summary.seconds, text=str(summary))
    print("REPORT " + json.dumps(report))
    return 0


@pytest.fixture(scope="module")
def report():
    env = {k: v for k, v in os.environ.items() if k not in ("TRITON_INTERPRET", "DSV4OPS_TRITON_TUNING")}
    run = subprocess.run([sys.executable, __file__], capture_output=True, text=True, env=env, timeout=1200)
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-4000:]
    line = next(line for line in run.stdout.splitlines() if line.startswith("REPORT "))
    return json.loads(line[len("REPORT "):])


SWEPT = [op for op in OP_NAMES if op not in W.NOT_ENUMERATED]


def test_every_op_is_swept_but_the_ones_warm_up_does_not_enumerate_yet():
    assert set(sweeps(W.engine_limits(**LIMITS), W.model_dims(**DIMS))) == set(SWEPT)


@pytest.mark.parametrize("op", SWEPT)
def test_a_sweep_within_the_limits_asks_for_no_variant_outside_the_warmup(report, op):
    got = report[op]
    assert got["calls"] > 0
    assert got["outside"] == [], f"{op}: {len(got['outside'])} variant(s) outside the warm-up: {got['outside'][:3]}"


# sm90's sparse_mla_prefill tiles are its decode tiles (backends/triton/tuning.py): the same variants.
SAME_VARIANTS = {"sparse_mla_prefill": "sparse_mla_decode"}


def test_the_warmup_compiled_every_kernel_op(report):
    """Every op with kernels of its own compiled some (the composites' are their parts')."""
    for op in SWEPT:
        assert report[op]["warmed"] > 0 or op in W.PARTS or report[SAME_VARIANTS.get(op, op)]["warmed"] > 0, op
    assert report["summary"]["variants"] == sum(report[op]["warmed"] for op in OP_NAMES)


@pytest.mark.parametrize("algo", ["split", "radix"])
def test_the_indexer_topk_sizes_reach_every_launch_variant(algo):
    """``topk_sizes`` finds a call for every launch variant of every (rows, width) within the limits,
    with either way of selecting split rows (``topk_algo``)."""
    from dsv4ops.backends.triton.indexer_topk import launch_variants, radix_variants
    from dsv4ops.backends.triton.tuning import Tuning

    ctx = W.Context(Tuning(topk_resident=1024, topk_min_piece=64, topk_block=256, topk_algo=algo), 32, 8)
    reached = {v for R, W_ in W.topk_sizes(64, 40, 5000, ctx) for v in launch_variants(R, W_, 64, ctx.tune, 32, 8)}
    every = {v for R in range(1, 41) for W_ in range(1, 5001) for v in launch_variants(R, W_, 64, ctx.tune, 32, 8)}
    assert reached == every
    radix = {v for pitch in (0, 1, 16) for v in radix_variants(ctx.tune, 32, pitch)}
    assert bool(radix & every) == (algo == "radix")


def test_presets_and_limits_are_checked():
    assert W.model_dims("v4-pro", 2).heads == 64
    assert W.model_dims("v4-flash", 1, heads=32).heads == 32
    with pytest.raises(InputError, match="preset"):
        W.model_dims("v3")
    with pytest.raises(InputError, match="tp=3"):
        W.model_dims("v4-flash", 3)
    with pytest.raises(InputError, match="unknown field.*max_tokenz"):
        W.engine_limits(max_tokenz=1)
    with pytest.raises(InputError, match="next_n=0"):
        W.engine_limits(next_n=0)


def test_on_the_cpu_warmup_and_bench_cold_refuse_clearly(capsys):
    """The interpreter compiles nothing: the API raises, the CLI says why (exit status 2)."""
    import dsv4ops
    from dsv4ops.cli import main as cli
    from dsv4ops.errors import UnsupportedError

    with pytest.raises(UnsupportedError, match="compiles kernels for a GPU"):
        dsv4ops.warmup(["inv_rope_fp8_quant"], device="cpu")
    assert cli(["warmup", "--ops", "inv_rope_fp8_quant", "--device", "cpu"]) == 2
    assert "compiles kernels for a GPU" in capsys.readouterr().err
    assert cli(["warmup", "--dim", "heads=many"]) == 2
    assert "--dim 'heads=many': expected NAME=INTEGER" in capsys.readouterr().err
    assert cli(["warmup", "--topk-modes", "sideways"]) == 2
    assert "--topk-modes" in capsys.readouterr().err
    if not __import__("torch").cuda.is_available():
        assert cli(["bench", "--cold", "--ops", "inv_rope_fp8_quant"]) == 2
        assert "bench --cold: first calls time kernel compiles" in capsys.readouterr().err


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
