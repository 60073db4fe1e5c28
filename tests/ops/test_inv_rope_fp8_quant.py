"""inv_rope_fp8_quant feeds fp8_einsum unchanged: the chain reproduces the o-projection
``z[t, g] = W_g · inverse_rope(o[t, heads of g])`` up to the FP8 rounding of the activations, on
every available backend, and RoPE followed by the inverse rotation gives the input back."""
import pytest
import torch

import dsv4ops
from dsv4ops.tolerance import calc_diff
from dsv4ops.sampling import cos_sin_cache, quantize_blocks
from dsv4ops.reference.impl.rope import cos_sin, rotate

from helpers import BACKENDS


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
