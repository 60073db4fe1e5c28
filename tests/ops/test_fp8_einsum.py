"""fp8_einsum's own tests. Its error inputs are declared in its spec (test_errors.py), its layouts
and aliases generated (test_strides.py).

The Triton fp8_einsum loads the tunables choose (pointers or TMA descriptors), each against the
reference: odd K-step counts,
group-major and sliced activations, batches that do not fill a row block, outputs narrower than a
column block; and the TMA variant falling back to pointer loads where descriptors cannot address
the operands."""
import re

import pytest
import torch
from helpers import BAD_SCALES, G, bf16, needs_triton, raises_input_error

import dsv4ops
from dsv4ops.conformance import build_inputs, run_case
from dsv4ops.conformance.cases import make_case
from dsv4ops.sampling import quantize_blocks

# --- the Triton loads the tunables choose ----------------------------------------------------

TUNABLES = ["einsum_tma=0", "einsum_tma=1", "einsum_tma=1,einsum_block_m=32,einsum_block_n=256", "einsum_block_n=64",
            "einsum_tma=1,einsum_block_n=32"]                               # 32 columns: one 32-wide weight block
CASES = [dict(B=5, H=2, D=128, R=384),                              # 3 K steps
         dict(B=19, H=3, D=256, R=640, group_major=True, out=True),   # [H, B, R] transposed, 5 K steps
         dict(B=4, H=1, D=384, R=256, out_dtype=torch.float32),       # D = 1.5 column blocks of 256
         dict(B=3, H=2, D=128, R=0),                                  # no K step: exact zeros
         dict(B=19, H=3, D=96, R=160, block=32, group_major=True, out=True),   # 32-wide: 5 K steps, D < a column block
         dict(B=4, H=1, D=288, R=96, block=32, out_dtype=torch.float32)]       # 9 weight blocks across 256 columns


@needs_triton
@pytest.mark.parametrize("tunables", TUNABLES)
@pytest.mark.parametrize("params", CASES, ids=lambda p: f"B{p['B']}-D{p['D']}-R{p['R']}-w{p.get('block', 128)}")
def test_einsum_variants_match_the_reference(env, tunables, params):
    env(DSV4OPS_TRITON_TUNING=tunables)
    result = run_case(make_case("fp8_einsum", **params), "triton", "cpu", seed=3)
    assert result.status == "pass", f"{result.message}\nrerun: {result.reproducer()}"


def _operands(B, H, D, R, pad, offset):
    """``a`` [B, H, R] cut from a [B, H, R + pad] buffer that starts ``offset`` bytes into its storage."""
    gen = torch.Generator().manual_seed(7)
    a, a_scale = quantize_blocks(torch.randn(B, H, R, generator=gen), 1)
    buf = torch.empty(offset + B * H * (R + pad), dtype=a.dtype)[offset:].view(B, H, R + pad)
    buf[..., :R] = a
    b, b_scale = quantize_blocks(torch.randn(H, D, R, generator=gen) * 0.05, 128)
    return buf[..., :R], a_scale, b, b_scale


@needs_triton
@pytest.mark.parametrize("pad,offset,tma", [(16, 0, True), (8, 0, False), (0, 1, False)])
def test_tma_variant_falls_back_where_descriptors_cannot_address_a(env, pad, offset, tma):
    """Strides and bases must be 16-byte multiples for TMA: a row stride of R + 8 or a base one
    byte off takes the pointer path, with the same result."""
    from dsv4ops.backends.triton.fp8_einsum import _descriptors
    env(DSV4OPS_TRITON_TUNING="einsum_tma=1")
    a, a_scale, b, b_scale = _operands(5, 2, 128, 256, pad, offset)
    assert (_descriptors(a, b, 16, 128, 128) is not None) == tma
    got = dsv4ops.fp8_einsum("bhr,hdr->bhd", a, a_scale, b, b_scale, out_dtype=torch.float32, backend="triton")
    want = dsv4ops.fp8_einsum("bhr,hdr->bhd", a, a_scale, b, b_scale, out_dtype=torch.float32, backend="reference")
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-4)


def test_descriptor_boxes_are_at_most_256_rows():
    from dsv4ops.backends.triton.fp8_einsum import _descriptors
    a = torch.zeros(4, 2, 256, dtype=torch.float8_e4m3fn)
    b = torch.zeros(2, 512, 256, dtype=torch.float8_e4m3fn)
    assert _descriptors(a, b, 256, 256, 128) is not None and _descriptors(a, b, 16, 512, 128) is None


# --- the reference against loops -------------------------------------------------------------

def test_fp8_einsum_matches_loops(gen):
    kw = build_inputs("fp8_einsum", "cpu", gen, B=2, H=2, D=128, R=256)
    got = dsv4ops.reference.fp8_einsum(**kw)
    a, sa, b, sb = kw["a"].double(), kw["a_scale"].double(), kw["b"].double(), kw["b_scale"].double()
    for bi in range(2):
        for h in range(2):
            for n in (0, 77, 127):
                want = sum(a[bi, h, r] * sa[bi, h, r // 128] * b[h, n, r] * sb[h, n // 128, r // 128]
                           for r in range(256))
                assert got[bi, h, n].item() == pytest.approx(bf16(float(want)), rel=2 ** -8)


# --- argument layouts and scale values -------------------------------------------------------

def test_einsum_expanded_out():
    kw = build_inputs("fp8_einsum", "cpu", G(), B=3, H=2, D=128, R=256)
    kw["out"] = torch.empty(1, 2, 128, dtype=torch.bfloat16).expand(3, 2, 128)
    raises_input_error("fp8_einsum", kw, "out", "overlap itself")


@pytest.mark.parametrize("value", BAD_SCALES)
@pytest.mark.parametrize("name", ["a_scale", "b_scale"])
def test_einsum_block_scale_values(name, value):
    kw = build_inputs("fp8_einsum", "cpu", G(), B=3, H=2, D=128, R=256)
    kw[name] = kw[name].clone()
    kw[name].view(-1)[1] = value
    raises_input_error("fp8_einsum", kw, name, "finite and > 0")


# --- 32-wide blocks (DeepSeek-V4.1): the width read off b_scale, UE8M0-valued scales ------------

def test_width_is_read_off_b_scale():
    """The same operands with 128- and 32-wide scales; a_scale must follow b_scale's width."""
    for block in (128, 32):
        kw = build_inputs("fp8_einsum", "cpu", G(), B=3, H=2, D=128, R=256, block=block)
        assert kw["b_scale"].shape == (2, 128 // block, 256 // block)
        dsv4ops.fp8_einsum(**kw, backend="reference")
    kw = build_inputs("fp8_einsum", "cpu", G(), B=3, H=2, D=128, R=256, block=32)
    kw["a_scale"] = kw["a_scale"][..., ::4].contiguous()          # 1 x 128 activations with 32 x 32 weights
    raises_input_error("fp8_einsum", kw, "a_scale", re.escape("must be [B, H, R/32] = [3, 2, 8]"))
    kw = build_inputs("fp8_einsum", "cpu", G(), B=3, H=2, D=96, R=160, block=32)
    kw["b_scale"] = torch.ones(2, 1, 1)
    raises_input_error("fp8_einsum", kw, "b_scale", re.escape("[2, 3, 5] for w = 32"))
    raises_input_error("fp8_einsum", kw, "b_scale", re.escape("none for w = 128 (D and R are not multiples of 128)"))


@pytest.mark.parametrize("name", ["a_scale", "b_scale"])
def test_32_wide_scales_must_be_powers_of_two(name):
    """V4.1's block scales are UE8M0 values; DeepGEMM's SM100 recipe keeps only their exponents."""
    kw = build_inputs("fp8_einsum", "cpu", G(), B=3, H=2, D=64, R=96, block=32)
    kw[name] = kw[name].clone()
    kw[name].view(-1)[1] *= 1.5
    raises_input_error("fp8_einsum", kw, name, re.escape("must be powers of two (UE8M0 values)"))
    kw = build_inputs("fp8_einsum", "cpu", G(), B=3, H=2, D=128, R=256)       # 128-wide: any fp32
    kw[name] = kw[name] * 1.5
    dsv4ops.fp8_einsum(**kw, backend="reference")


# --- DeepGEMM: SM90 takes 128-wide blocks, SM100 (API 2.8) 32-wide ones with recipe (1, 32, 32) ------

_DG_32 = [make_case("fp8_einsum", **kw) for kw in (
    dict(B=5, H=2, D=96, R=160, block=32), dict(B=3, H=3, D=256, R=224, block=32, group_major=True, out=True),
    dict(B=4, H=1, D=64, R=128, block=32, strided="a_scale:transposed"))]


def _deepgemm_status(arch, params):
    kw = make_case("fp8_einsum", **params).build("cpu", 0)
    with dsv4ops.simulate_platform("cuda", arch):
        return {c.backend: c.status for c in dsv4ops.explain("fp8_einsum", **kw).candidates}["deepgemm"]


@pytest.mark.parametrize("generation", ["2.8", "2.5", "legacy"])
def test_deepgemm_einsum_recipe_per_arch_and_width(monkeypatch, generation):
    from fakes import deep_gemm as fake_deep_gemm
    from fakes import reprobed
    fake_deep_gemm.install(monkeypatch, generation)
    with reprobed(monkeypatch, "deepgemm"):
        assert _deepgemm_status("sm90", dict(B=2, H=2, D=96, R=160, block=32)) == (
            "32-wide scale blocks: DeepGEMM's SM90 fp8 einsum takes 128-wide K blocks only (recipe (1, 128, 128)); "
            "32-wide blocks run on SM100")
        sm100_32 = _deepgemm_status("sm100", dict(B=2, H=2, D=96, R=160, block=32))
        if generation == "2.8":
            assert sm100_32 == "selected" or sm100_32.startswith("available"), sm100_32
            with dsv4ops.simulate_platform("cuda", "sm100"):
                results = [run_case(c, "deepgemm", "cpu", seed=5) for c in _DG_32]
            assert [r.status for r in results] == ["pass"] * len(_DG_32), [r.message for r in results]
        else:
            assert sm100_32 == ("32-wide scale blocks on sm100 are adapted for DeepGEMM API 2.8 "
                                f"(installed: API {generation})")


def test_deepgemm_sm100_fake_keeps_only_scale_exponents(monkeypatch):
    """The fake models SM100's UE8M0 packing: a non-power-of-two scale (which the op refuses for
    32-wide blocks) would be truncated to its exponent, so the recipe is exact only for UE8M0 values."""
    from fakes import deep_gemm as fake_deep_gemm
    kw = build_inputs("fp8_einsum", "cpu", G(), B=2, H=1, D=32, R=32, block=32)
    d = torch.empty(2, 1, 32, dtype=torch.bfloat16)
    with dsv4ops.simulate_platform("cuda", "sm100"):
        fake_deep_gemm.fp8_einsum_28(kw["equation"], (kw["a"], kw["a_scale"] * 1.5), (kw["b"], kw["b_scale"]), d,
                                     recipe=(1, 32, 32))
    torch.testing.assert_close(d, dsv4ops.reference.fp8_einsum(**kw))
