"""fp8_einsum's own tests. Its error inputs are declared in its spec (test_errors.py), its layouts
and aliases generated (test_strides.py).

The Triton fp8_einsum loads the tunables choose (pointers or TMA descriptors), each against the
reference: odd K-step counts,
group-major and sliced activations, batches that do not fill a row block, outputs narrower than a
column block; and the TMA variant falling back to pointer loads where descriptors cannot address
the operands."""
import pytest
import torch
from helpers import BAD_SCALES, G, bf16, needs_triton, raises_input_error

import dsv4ops
from dsv4ops.conformance import build_inputs, run_case
from dsv4ops.conformance.cases import make_case
from dsv4ops.sampling import quantize_blocks

# --- the Triton loads the tunables choose ----------------------------------------------------

TUNABLES = ["einsum_tma=0", "einsum_tma=1", "einsum_tma=1,einsum_block_m=32,einsum_block_n=256", "einsum_block_n=64"]
CASES = [dict(B=5, H=2, D=128, R=384),                              # 3 K steps
         dict(B=19, H=3, D=256, R=640, group_major=True, out=True),   # [H, B, R] transposed, 5 K steps
         dict(B=4, H=1, D=384, R=256, out_dtype=torch.float32),       # D = 1.5 column blocks of 256
         dict(B=3, H=2, D=128, R=0)]                                  # no K step: exact zeros


@needs_triton
@pytest.mark.parametrize("tunables", TUNABLES)
@pytest.mark.parametrize("params", CASES, ids=lambda p: f"B{p['B']}-D{p['D']}-R{p['R']}")
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
