"""The Triton backend's two fp8 arithmetic paths (backends/triton/__init__.py): which one each
platform gets, the quick conformance tier through the software path (under the interpreter, with
no fp8 type anywhere in the kernels), and the software writers' bytes against the FP8 path's."""
import pytest
import torch

import dsv4ops
from dsv4ops.conformance import cases, run_case
from dsv4ops.conformance.cases import make_case
from dsv4ops.errors import ConfigError
from dsv4ops.ops import OP_NAMES
from dsv4ops.quant import to_fp8

TRITON = any(b.name == "triton" and b.available for b in dsv4ops.backends())
pytestmark = pytest.mark.skipif(not TRITON, reason="Triton (or its interpreter) is not available")

SOFT = "triton (fp8 in software)"


@pytest.mark.parametrize("plat,soft", [
    ("cuda:sm80", True), ("cuda:sm86", True), ("cuda:sm89", False), ("cuda:sm90", False), ("cuda:sm120", False),
    ("rocm:gfx90a", True), ("rocm:gfx1100", True), ("rocm:gfx1151", True), ("rocm:gfx942", False),
    ("rocm:gfx950", False), ("rocm:gfx1201", False)])
def test_the_platform_picks_the_path(plat, soft, env):
    from dsv4ops.backends.triton.tuning import target

    with dsv4ops.simulate_platform(*plat.split(":")) as p:
        assert target(p).fp8_soft is soft
        env(DSV4OPS_TRITON_TUNING="fp8_path=soft")
        assert target(p).fp8_soft
        env(DSV4OPS_TRITON_TUNING="fp8_path=hw")
        assert not target(p).fp8_soft


def test_the_path_tunable_is_validated(env):
    from dsv4ops.backends.triton.tuning import tuning

    env(DSV4OPS_TRITON_TUNING="fp8_path=fast")
    with dsv4ops.simulate_platform("cuda", "sm90") as p, pytest.raises(ConfigError, match="must be auto, soft or hw"):
        tuning(p)


def _typical(op):
    return next(c for c in cases(op, "quick") if c.kwargs.get("T", c.kwargs.get("B", 1)) not in (0,))


@pytest.mark.parametrize("op", [op for op in OP_NAMES if op not in ("indexer_topk", "candidate_blocks")])  # no fp8
def test_explain_names_the_path(op, env):
    kwargs = _typical(op).build("cpu", 0)
    with dsv4ops.simulate_platform("cuda", "sm86"):
        assert dsv4ops.explain(op, **kwargs).selected.name == SOFT
    with dsv4ops.simulate_platform("cuda", "sm90"):
        assert dsv4ops.explain(op, **kwargs).selected.name == "triton"
    with dsv4ops.simulate_platform("cuda", "sm75"):
        decision = dsv4ops.explain(op, **kwargs, backend="triton")
        if op in ("sparse_mla_decode", "sparse_mla_prefill"):    # bf16 dots (the query is bf16)
            assert decision.selected is None and "bf16 tensor cores" in decision.error
        else:                                                   # fp16 dots or none
            assert decision.selected.name == SOFT
    env(DSV4OPS_TRITON_TUNING="fp8_path=soft")
    assert dsv4ops.explain(op, **kwargs).selected.name == SOFT


QUICK = [case for op in OP_NAMES for case in cases(op, "quick")]


@pytest.mark.parametrize("case", QUICK, ids=[c.id for c in QUICK])
def test_quick_tier_through_the_software_path(case, env, no_fp8_types):
    env(DSV4OPS_TRITON_TUNING="fp8_path=soft")
    result = run_case(case, "triton", "cpu", seed=hash(case.id) % 10_000)
    if result.status == "skip":   # FNUZ e4m3 (gfx942) has the FP8 path only
        assert "fnuz" in case.id, result.message
        pytest.skip(result.message)
    assert result.status == "pass", f"{result.message}\nrerun: {result.reproducer()}"


# --- the writers: software bytes == FP8-path bytes ----------------------------------------------

def _wide_range(gen, n):
    """Per-channel factors 2^-30 .. 2^10: tiles with tiny amax (the floor), e4m3 subnormals next to
    large values, and exact powers of two (amax / 448 a power of two)."""
    f = torch.pow(2.0, torch.randint(-30, 11, (n,), generator=gen).float())
    f[::7] = 0.0
    return f


def _qnorm_inputs(gen, layout):
    kwargs = make_case("qnorm_rope_kv_insert", T=6, H=3, layout=layout, block_size=16, num_blocks=2,
                       skip_slots=0.0).build("cpu", 0)
    kv = kwargs["kv"].float() * _wide_range(gen, 512)
    kv[0, :64] = 448.0 * 2.0 ** -3                          # amax / 448 an exact power of two
    kv[1, :64] = torch.linspace(-1, 1, 64) * 2.0 ** -20     # below the 1e-4 floor
    kwargs["kv"] = kv.to(torch.bfloat16)
    if layout == "fp8_per_tensor":
        kwargs["kv_scale"], kwargs["q_scale"] = 2.0 ** -6, 2.0 ** -9     # values past ±448 saturate
    return kwargs


def _compress_inputs(gen, layout):
    ratio = 4 if layout == "fp8_ds_mla" else 128
    kwargs = make_case("compress_kv_insert", layout=layout, ratio=ratio, block_size=4,
                       reqs=((0, 9), (5, 3), (0, 2 * ratio))).build("cpu", 0)
    width = kwargs["kv"].shape[1]
    kwargs["kv"] = kwargs["kv"] * _wide_range(gen, width)
    kwargs["state_cache"][..., :width] *= _wide_range(gen, width)
    return kwargs


def _inv_rope_inputs(gen, _):
    kwargs = make_case("inv_rope_fp8_quant", T=5, H=16, n_groups=2, corner="zero_head").build("cpu", 0)
    kwargs["o"] = (kwargs["o"].float() * _wide_range(gen, 512)).to(torch.bfloat16)
    return kwargs


WRITERS = [("qnorm_rope_kv_insert", _qnorm_inputs, layout) for layout in ("fp8_ds_mla", "fp8_per_tensor", "bf16")]
WRITERS += [("compress_kv_insert", _compress_inputs, layout) for layout in ("fp8_ds_mla", "index_fp8")]
WRITERS += [("inv_rope_fp8_quant", _inv_rope_inputs, None)]


def _bytes(x):
    if x is None:
        return []
    if isinstance(x, (tuple, list)):
        return [b for item in x for b in _bytes(item)]
    return [x.contiguous().view(torch.uint8)] if isinstance(x, torch.Tensor) else []


@pytest.mark.parametrize("op,make,layout", WRITERS, ids=[f"{op}-{layout}" for op, _, layout in WRITERS])
def test_software_writers_write_the_fp8_paths_bytes(op, make, layout, env, gen):
    from dsv4ops.tensors import clone_kwargs

    kwargs = make(gen, layout)
    written = {}
    for path in ("hw", "soft"):
        env(DSV4OPS_TRITON_TUNING=f"fp8_path={path}")
        kw = clone_kwargs(kwargs)
        assert dsv4ops.explain(op, **kw).selected.name == ("triton" if path == "hw" else SOFT)
        result = getattr(dsv4ops, op)(**kw, backend="triton")
        written[path] = _bytes(result) + [t.view(torch.uint8) for name, t in sorted(kw.items())
                                          if name in ("kv_cache", "state_cache", "q")]
    assert len(written["hw"]) == len(written["soft"]) > 0
    for hw, soft in zip(written["hw"], written["soft"]):
        assert torch.equal(hw, soft), f"{(hw != soft).sum()} bytes differ"


if TRITON:
    import triton
    import triton.language as tl

    from dsv4ops.backends.triton.common import e4m3_encode, e4m3_to_f32

    @triton.jit
    def _codec(byte_ptr, value_ptr, x_ptr, out_ptr, N: tl.constexpr, M: tl.constexpr):
        i = tl.arange(0, N)
        tl.store(value_ptr + i, e4m3_to_f32(tl.load(byte_ptr + i)))
        j = tl.arange(0, M)
        tl.store(out_ptr + j, e4m3_encode(tl.load(x_ptr + j)))


def test_e4m3_codec_follows_the_contract(no_fp8_types):
    """Every byte decodes to its e4m3 value; encoding saturates, rounds to nearest even and keeps
    NaN (with its sign), as dsv4ops.quant.to_fp8 (docs/ops.md §0)."""
    every = torch.arange(256, dtype=torch.uint8)
    finite = every.view(torch.float8_e4m3fn).float()
    finite = finite[~finite.isnan()].unique()
    ties = (finite[1:] + finite[:-1]) / 2
    x = torch.cat([ties, ties.nextafter(torch.tensor(1e9)), ties.nextafter(torch.tensor(-1e9)), -ties, finite,
                   torch.tensor([float("nan"), -float("nan"), float("inf"), -float("inf"), 464.0, 1e30, -0.0,
                                 2.0 ** -10, 1e-40]),
                   torch.randn(512, generator=torch.Generator().manual_seed(0)) * 2.0 ** -7])
    x = torch.nn.functional.pad(x, (0, 2048 - x.numel()))
    values, out = torch.empty(256), torch.empty(2048, dtype=torch.uint8)
    _codec[(1,)](every, values, x, out, N=256, M=2048)
    assert torch.equal(values.nan_to_num(7.0), every.view(torch.float8_e4m3fn).float().nan_to_num(7.0))
    assert torch.equal(out, to_fp8(x).view(torch.uint8))
