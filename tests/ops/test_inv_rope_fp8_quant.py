"""inv_rope_fp8_quant feeds fp8_einsum unchanged: the chain reproduces the o-projection
``z[t, g] = W_g · inverse_rope(o[t, heads of g])`` up to the FP8 rounding of the activations, on
every available backend, and RoPE followed by the inverse rotation gives the input back."""
import pytest
import torch
from dsv4ops.reference.impl.rope import cos_sin, rotate
from helpers import BACKENDS

import dsv4ops
from dsv4ops.conformance import build_inputs
from dsv4ops.sampling import cos_sin_cache, quantize_blocks
from dsv4ops.tolerance import calc_diff


@pytest.mark.parametrize("backend", BACKENDS)
def test_chain_matches_the_o_projection(backend):
    gen = torch.Generator().manual_seed(5)
    T, H, G, D = 6, 16, 2, 256
    x = torch.randn(T, H, 512, generator=gen) * 0.3            # the attention output before RoPE is undone
    positions = torch.randint(0, 512, (T,), generator=gen)
    cs = cos_sin_cache(512)
    cos, sin = cos_sin(cs, positions)
    o = rotate(x, cos[:, None], sin[:, None]).to(torch.bfloat16)
    w8, w_scale = quantize_blocks(torch.randn(G, D, H // G * 512, generator=gen) * 0.05, 128)
    a, a_scale = dsv4ops.inv_rope_fp8_quant(o, positions, cs, n_groups=G, backend=backend)
    z = dsv4ops.fp8_einsum("bhr,hdr->bhd", a, a_scale, w8, w_scale, out_dtype=torch.float32, backend=backend)
    w = w8.double() * w_scale.double().repeat_interleave(128, 1).repeat_interleave(128, 2)
    unrotated = rotate(o.float(), cos[:, None], -sin[:, None]).double().reshape(T, G, -1)
    want = torch.einsum("tgk,gdk->tgd", unrotated, w)
    assert calc_diff(z, want) < 1e-3          # e4m3 activations (measured 3e-4); no inverse RoPE gives 8e-2
    assert torch.allclose(unrotated.float(), x.reshape(T, G, -1), atol=2e-2, rtol=2 ** -7)


# Contract decision (docs/ops.md): what this input produces, or that it raises.
@pytest.mark.parametrize("backend", ["reference", "triton"])
def test_inv_rope_nan_stays_in_its_block(backend):
    """§8: a NaN in o makes only the 1x128 blocks it reaches (after the inverse RoPE, which mixes a
    head's last 64 values in pairs) unspecified; every other block is quantized as without it."""
    kw = build_inputs("inv_rope_fp8_quant", "cpu", torch.Generator().manual_seed(11), T=3, H=4, n_groups=2)
    clean_a, clean_s = dsv4ops.inv_rope_fp8_quant(**kw, backend="reference")
    o = kw["o"].clone()
    o[1, 2, 470] = float("nan")                   # token 1, head 2, a RoPE value: block 3 of that head
    a, scale = dsv4ops.inv_rope_fp8_quant(**dict(kw, o=o), backend=backend)
    blocks = a.view(torch.uint8).view(3, 2, -1, 128)
    want = clean_a.view(torch.uint8).view(3, 2, -1, 128)
    hit = torch.zeros(3, 2, blocks.shape[2], dtype=torch.bool)
    hit[1, 1, (2 % 2) * 4 + 3] = True             # group 1 holds heads 2-3: head 2's fourth block
    assert torch.equal(blocks[~hit], want[~hit])
    assert torch.equal(scale.view(3, 2, -1)[~hit], clean_s.view(3, 2, -1)[~hit])
