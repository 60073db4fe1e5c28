"""The warm-up set is closed (issue #31): on this CPU machine, with the compile-only driver for sm90
(tests/compile_only.py), the variants ``dsv4ops.warmup`` compiles for V4-Flash dims and a set of
engine limits include every variant a sweep of shapes within those limits asks for (T = 1..40,
rows 1..40, contexts growing one token at a time, widths up to the limit). A call's variants are
Triton's own keys, computed by the launch path (``backends/triton/warmup.py``'s ``variant_keys``), so
the test cannot drift from the launchers; the sweeps are this test's own, independent of the
kernels' warm-up declarations they check. Runs in a subprocess: the kernels must be imported
compiled, not interpreted (the conftest sets TRITON_INTERPRET=1)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from dsv4ops import deployment as D
from dsv4ops import warm_up as W
from dsv4ops.errors import InputError
from dsv4ops.ops import OP_NAMES

# fp8_einsum's D and R are fixed per model (V4's are 1024 and 4096); smaller ones keep its CPU inputs small.
# candidate_blocks' 2048 blocks per row keep the two-level logits 16K wide; 64 keep them small.
DIMS = dict(o_lora_rank=256, o_group_k=512, candidate_blocks=64)
LIMITS = dict(max_tokens=64, max_context=16384, next_n=2)


def sweeps(lim: D.Limits, dims: D.ModelDims) -> dict[str, list[dict]]:
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
    blocks = dict(sparse_block=dims.candidate_block, num_blocks=dims.candidate_blocks)
    candidates = [dict(R=R, W=R * 97 % width, mode="ranges", **blocks) for R in range(1, 41)]
    candidates += [dict(R=R, W=1, mode="ranges", **blocks) for R in (1, 3)]
    candidates += [dict(R=R * n, W=w, mode=m, next_n=n, **blocks) for R, w in zip(range(1, 21), range(0, 4000, 191))
                   for m in ("decode1d", "decode2d")]
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
        "candidate_blocks": candidates,
        "sparse_mqa_logits": [dict(T=T, S=S, H=dims.v41_index_heads, clean=T % 2 == 0, **blocks)
                              for T, S in zip(range(1, 31), range(0, 4000, 131))],
        "paged_sparse_mqa_logits": [dict(B=B, next_n=n, context=c, H=dims.v41_index_heads, block_size=lim.c4_block,
                                         layout=lay, lens_dim=d, clean=cl, **blocks)
                                    for B, c in zip(range(1, 13), range(1, 2000, 167))
                                    for lay, d, cl in (("index_fp8", 1, B % 2 == 0), ("index_mxfp4", 2, B % 3 == 0),
                                                       ("index_fp8", 2, B % 3 == 1), ("index_mxfp4", 1, B % 2 == 1))],
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
    from dsv4ops.backends.triton.warmup import compile_without_launching, variant_keys
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
        dims, lim = D.model_dims(**DIMS), D.engine_limits(**LIMITS)
        gen = torch.Generator().manual_seed(1)
        for op, calls in sweeps(lim, dims).items():
            impls = triton.implementations[op]
            outside: set = set()
            for params in calls:
                call = OPS[op].validate_call(**OPS[op].spec.conformance.inputs("cpu", gen, **params))
                impl = next(i for i in impls if i.decline_reason(plat, call.key) is None)
                with compile_without_launching():     # warmed variants return without launching
                    outside |= variant_keys(lambda impl=impl, call=call: impl.bound(plat)(call.args))
            warmed = next(o for o in summary.ops if o.op == op)
            report[op] = dict(warmed=warmed.compiled, calls=len(calls), outside=sorted(map(list, outside)))
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


def test_every_op_is_swept():
    assert set(sweeps(D.engine_limits(**LIMITS), D.model_dims(**DIMS))) == set(OP_NAMES)


@pytest.mark.parametrize("op", OP_NAMES)
def test_a_sweep_within_the_limits_asks_for_no_variant_outside_the_warmup(report, op):
    got = report[op]
    assert got["calls"] > 0
    assert got["outside"] == [], f"{op}: {len(got['outside'])} variant(s) outside the warm-up: {got['outside'][:3]}"


# sm90's sparse_mla_prefill tiles are its decode tiles (backends/triton/tuning.py): the same variants;
# the fused indexers run the logits and top-k kernels over chunks of rows (``fused_path`` auto).
SAME_VARIANTS = {"sparse_mla_prefill": "sparse_mla_decode", "paged_mqa_topk": "paged_mqa_logits",
                 "mqa_topk": "mqa_logits"}


def test_the_warmup_compiled_every_kernel_op(report):
    """Every op compiled some variants of its own."""
    for op in OP_NAMES:
        assert report[op]["warmed"] > 0 or report[SAME_VARIANTS.get(op, op)]["warmed"] > 0, op
    assert report["summary"]["variants"] == sum(report[op]["warmed"] for op in OP_NAMES)


def test_the_indexer_topk_sizes_reach_every_launch_variant():
    """``topk_sizes`` finds a call for every launch variant of every (rows, width) within the limits."""
    from dsv4ops.backends.triton.indexer_topk import launch_variants, topk_sizes
    from dsv4ops.backends.triton.tuning import Tuning

    tune = Tuning(topk_resident=1024, topk_min_piece=64, topk_block=256, topk_threshold_min=2048)
    reached = {v for R, W_ in topk_sizes(64, 40, 5000, tune, 32, 8) for v in launch_variants(R, W_, 64, tune, 32, 8)}
    every = {v for R in range(1, 41) for W_ in range(1, 5001) for v in launch_variants(R, W_, 64, tune, 32, 8)}
    assert reached == every


@pytest.fixture
def jit_by_size():
    """A CUDA vendor fp8_einsum whose JIT compiles per B (``jit_per_size``): ``runs`` records, per
    run, B and the storage of a, a_scale and out; it refuses the B in ``refused``."""
    from types import SimpleNamespace

    from dsv4ops.errors import UnsupportedError
    from dsv4ops.registry import Backend, register_backend, unregister_backend

    fake = SimpleNamespace(runs=[], refused=set())

    def einsum(a):
        if a.a.shape[0] in fake.refused:
            raise UnsupportedError(f"B={a.a.shape[0]} refused")
        fake.runs.append((a.a.shape[0], a.a_scale.shape[0], a.out.shape[0],
                          *(t.untyped_storage().data_ptr() for t in (a.a, a.a_scale, a.out))))
        return a.out

    backend = register_backend(Backend("jit_by_size", ("cuda",)))
    backend.implements("fp8_einsum", einsum, priority=1, jit_per_size="its JIT picks a kernel per M")
    yield fake
    unregister_backend("jit_by_size")


def test_a_vendor_jit_per_size_runs_at_every_size_on_views_of_one_call(jit_by_size):
    """Every B in 1..max_tokens exactly once per representative call (both a layouts), each call's
    a, a_scale and out sliced from one allocation per layout; counted, timed and reported."""
    import dsv4ops

    runs, limit, reports = jit_by_size.runs, 37, []
    with dsv4ops.simulate_platform("cuda", "sm90") as plat:
        summary = dsv4ops.warmup(["fp8_einsum"], dims=DIMS, limits=dict(max_tokens=limit), device="cpu",
                                 backends=["jit_by_size"], progress=lambda *a: reports.append(a))
    layouts = len(W.representative_calls("fp8_einsum", D.model_dims(**DIMS), D.engine_limits(max_tokens=limit),
                                         D.Machine(plat, "cpu", 4)))
    assert layouts == 2
    assert [r[:3] for r in runs] == [(n, n, n) for _ in range(layouts) for n in range(1, limit + 1)]
    for i in range(layouts):                                   # one allocation per tensor and layout
        storages = {r[3:] for r in runs[i * limit:(i + 1) * limit]}
        assert len(storages) == 1
    assert len({r[3:] for r in runs}) == layouts
    op = summary.ops[0]
    assert (op.op, op.vendor_calls, op.backends, op.skipped) == ("fp8_einsum", layouts * limit, {"jit_by_size"}, [])
    assert op.seconds > 0
    assert reports[-1][0] == reports[-1][1] == layouts + layouts * limit      # the calls, then every size
    assert all(text.endswith(f"every size up to {limit})") for done, _, text in reports if done > layouts)


def test_a_refusal_stops_that_run_and_is_reported(jit_by_size):
    import dsv4ops

    jit_by_size.refused.add(6)
    with dsv4ops.simulate_platform("cuda", "sm90"):
        summary = dsv4ops.warmup(["fp8_einsum"], dims=DIMS, limits=dict(max_tokens=9), device="cpu",
                                 backends=["jit_by_size"])
    assert [r[0] for r in jit_by_size.runs] == [1, 2, 3, 4, 5] * 2
    assert summary.ops[0].vendor_calls == 10
    assert summary.ops[0].skipped == [("jit_by_size", "at size 6: B=6 refused")] * 2


def test_grown_keeps_the_layout_and_repeats_the_rows():
    """The largest call has each leading tensor's dimension order (a group-major ``a`` stays
    group-major) and the call's rows repeated; ``at_size`` cuts views of it."""
    import torch

    from dsv4ops.ops import OPS

    spec = OPS["fp8_einsum"].spec
    gen = torch.Generator().manual_seed(3)
    call = OPS["fp8_einsum"].validate_call(**spec.conformance.inputs("cpu", gen, B=3, H=2, D=128, R=256,
                                                                     group_major=True, out=True))
    big = W.grown("fp8_einsum", call.args, 8)
    assert big.a.shape == (8, 2, 256) and big.a.stride() == (256, 8 * 256, 1)
    assert big.b is call.args.b and big.b_scale is call.args.b_scale
    assert big.out.shape == (8, 2, 128) and big.out.is_contiguous()
    rows = torch.arange(8) % 3
    assert torch.equal(big.a.view(torch.uint8), call.args.a.view(torch.uint8)[rows])
    assert torch.equal(big.a_scale, call.args.a_scale[rows])
    cut = spec.at_size(big, 5)
    assert cut.a.shape[0] == cut.a_scale.shape[0] == cut.out.shape[0] == 5
    assert cut.a.data_ptr() == big.a.data_ptr() and cut.out.data_ptr() == big.out.data_ptr()


def test_presets_and_limits_are_checked():
    assert D.model_dims("v4-pro", 2).heads == 64
    assert D.model_dims("v4-flash", 1, heads=32).heads == 32
    with pytest.raises(InputError, match="preset"):
        D.model_dims("v3")
    with pytest.raises(InputError, match="tp=3"):
        D.model_dims("v4-flash", 3)
    with pytest.raises(InputError, match="unknown field.*max_tokenz"):
        D.engine_limits(max_tokenz=1)
    with pytest.raises(InputError, match="next_n=0"):
        D.engine_limits(next_n=0)


def test_on_the_cpu_warmup_returns_an_empty_summary_and_the_cli_refuses_clearly(capsys):
    """The interpreter compiles nothing: the API (an engine's start-up line on a machine without a
    GPU) returns an empty summary saying why, with one warning; the CLI says why (exit status 2)."""
    import dsv4ops
    from dsv4ops.cli import main as cli

    with pytest.warns(UserWarning, match="compiles kernels for a GPU") as caught:
        summary = dsv4ops.warmup(["inv_rope_fp8_quant"], device="cpu")
    assert len(caught) == 1
    assert (summary.ops, summary.variants, summary.platform) == ([], set(), str(dsv4ops.platform("cpu")))
    assert "compiles kernels for a GPU" in summary.reason and summary.reason in str(summary)
    with pytest.raises(InputError, match="limits: next_n=0"):             # bad input is still an error
        dsv4ops.warmup(device="cpu", limits=dict(next_n=0))
    assert cli(["warmup", "--ops", "inv_rope_fp8_quant", "--device", "cpu"]) == 2
    err = capsys.readouterr().err
    assert "compiles kernels for a GPU" in err and err.count("compiles kernels for a GPU") == 1
    assert cli(["warmup", "--dim", "heads=many"]) == 2
    assert "--dim 'heads=many': expected NAME=INTEGER" in capsys.readouterr().err
    assert cli(["warmup", "--topk-modes", "sideways"]) == 2
    assert "--topk-modes" in capsys.readouterr().err
    if not __import__("torch").cuda.is_available():
        assert cli(["bench", "--cold", "--ops", "inv_rope_fp8_quant"]) == 2
        assert "bench --cold: first calls time kernel compiles" in capsys.readouterr().err


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
