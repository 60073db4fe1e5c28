"""inv_rope_fp8_quant feeds fp8_einsum unchanged, with V4's 128-wide and V4.1's 32-wide blocks: the
chain reproduces the o-projection ``z[t, g] = W_g · inverse_rope(o[t, heads of g])`` up to the FP8
rounding of the activations, on every available backend, and RoPE followed by the inverse rotation
gives the input back."""
import pytest
import torch
from dsv4ops.reference.impl.rope import cos_sin, rotate
from helpers import BACKENDS

import dsv4ops
from dsv4ops.conformance import build_inputs
from dsv4ops.quant import SCALE_BLOCKS
from dsv4ops.sampling import cos_sin_cache, quantize_blocks
from dsv4ops.tolerance import calc_diff


@pytest.mark.parametrize("block", SCALE_BLOCKS)
@pytest.mark.parametrize("backend", BACKENDS)
def test_chain_matches_the_o_projection(backend, block):
    gen = torch.Generator().manual_seed(5)
    T, H, G, D = 6, 16, 2, 256
    x = torch.randn(T, H, 512, generator=gen) * 0.3            # the attention output before RoPE is undone
    positions = torch.randint(0, 512, (T,), generator=gen)
    cs = cos_sin_cache(512)
    cos, sin = cos_sin(cs, positions)
    o = rotate(x, cos[:, None], sin[:, None]).to(torch.bfloat16)
    w8, w_scale = quantize_blocks(torch.randn(G, D, H // G * 512, generator=gen) * 0.05, block, block)
    a, a_scale = dsv4ops.inv_rope_fp8_quant(o, positions, cs, n_groups=G, block=block, backend=backend)
    assert a_scale.shape == (T, G, H // G * 512 // block)
    z = dsv4ops.fp8_einsum("bhr,hdr->bhd", a, a_scale, w8, w_scale, out_dtype=torch.float32, backend=backend)
    ref_a, ref_scale = dsv4ops.reference.inv_rope_fp8_quant(o, positions, cs, n_groups=G, block=block)
    ref_z = dsv4ops.reference.fp8_einsum("bhr,hdr->bhd", ref_a, ref_scale, w8, w_scale, out_dtype=torch.float32)
    assert calc_diff(z, ref_z) < 1e-6                 # the reference chain, up to FP8 ties and accumulation order
    w = w8.double() * w_scale.double().repeat_interleave(block, 1).repeat_interleave(block, 2)
    unrotated = rotate(o.float(), cos[:, None], -sin[:, None]).double().reshape(T, G, -1)
    want = torch.einsum("tgk,gdk->tgd", unrotated, w)
    assert calc_diff(z, want) < 1e-3          # e4m3 activations (measured 3e-4); no inverse RoPE gives 8e-2
    assert torch.allclose(unrotated.float(), x.reshape(T, G, -1), atol=2e-2, rtol=2 ** -7)


# Contract decision (docs/ops.md): what this input produces, or that it raises.
@pytest.mark.parametrize("block", SCALE_BLOCKS)
@pytest.mark.parametrize("backend", ["reference", "triton"])
def test_inv_rope_nan_stays_in_its_block(backend, block):
    """§8: a NaN in o makes only the blocks it reaches (after the inverse RoPE, which mixes a head's
    last 64 values in pairs) unspecified; every other block is quantized as without it."""
    kw = build_inputs("inv_rope_fp8_quant", "cpu", torch.Generator().manual_seed(11), T=3, H=4, n_groups=2,
                      block=block)
    clean_a, clean_s = dsv4ops.inv_rope_fp8_quant(**kw, backend="reference")
    o = kw["o"].clone()
    o[1, 2, 470] = float("nan")          # token 1, head 2 (slot 0 of group 1), a RoPE value paired with 471
    a, scale = dsv4ops.inv_rope_fp8_quant(**dict(kw, o=o), backend=backend)
    blocks = a.view(torch.uint8).view(3, 2, -1, block)
    want = clean_a.view(torch.uint8).view(3, 2, -1, block)
    hit = torch.zeros(3, 2, blocks.shape[2], dtype=torch.bool)
    hit[1, 1, 470 // block] = True       # the one block holding dims 470 and 471 of head 2
    assert torch.equal(blocks[~hit], want[~hit])
    assert torch.equal(scale.view(3, 2, -1)[~hit], clean_s.view(3, 2, -1)[~hit])


@pytest.mark.parametrize("corner", [None, "saturate", "tiny", "zero_head"])
def test_32_wide_blocks_are_the_references_bytes_on_both_fp8_paths(env, corner):
    """Triton's hardware and software fp8 paths write the reference's bytes for 32-wide blocks, at
    saturating tiles, amax under both floors and all-zero heads alike."""
    kw = build_inputs("inv_rope_fp8_quant", "cpu", torch.Generator().manual_seed(3), T=4, H=8, n_groups=2,
                      block=32, corner=corner)
    ref_a, ref_s = dsv4ops.inv_rope_fp8_quant(**kw, backend="reference")
    for path in ("hw", "soft"):
        env(DSV4OPS_TRITON_TUNING=f"fp8_path={path}")
        a, scale = dsv4ops.inv_rope_fp8_quant(**kw, backend="triton")
        assert torch.equal(scale, ref_s), path
        assert torch.equal(a.view(torch.uint8), ref_a.view(torch.uint8)), path


def test_32_wide_amax_floor_is_1e_10():
    """§8: the floor is 1e-10 for both widths (a block of amax 1e-6 keeps its own scale, one of
    amax under 1e-10 gets 2^ceil(log2(1e-10 / 448)) = 2^-42)."""
    kw = build_inputs("inv_rope_fp8_quant", "cpu", torch.Generator().manual_seed(4), T=2, H=2, n_groups=1,
                      block=32, corner="tiny")
    _, scale = dsv4ops.inv_rope_fp8_quant(**kw, backend="reference")
    amax = kw["o"][:, 0, :448].float().reshape(2, -1, 32).abs().amax(-1)
    assert bool((amax[:, 1] < 1e-10).all()) and bool(((amax[:, 0] > 1e-10) & (amax[:, 0] < 1e-4)).all())
    assert torch.equal(scale[:, 0, 1], torch.full((2,), 2.0 ** -42))
    assert torch.equal(scale[:, 0, 0], 2.0 ** torch.ceil(torch.log2(amax[:, 0] / 448)))


def test_block_must_be_128_or_32():
    kw = build_inputs("inv_rope_fp8_quant", "cpu", torch.Generator().manual_seed(1), T=2, H=2, n_groups=1)
    with pytest.raises(dsv4ops.InputError, match="block.*must be one of \\[32, 128\\], got 64"):
        dsv4ops.inv_rope_fp8_quant(**kw | dict(block=64))
