"""Reference for docs/ops.md §8: inverse RoPE in fp32, then 1 x block power-of-two FP8 (block 128 or 32)."""
from __future__ import annotations

import torch

from dsv4ops.quant import to_fp8, ue8m0_scale

from .rope import cos_sin, rotate

AMAX_FLOOR = 1e-10               # the activation quantizer's floor, both widths (not the cache writers' 1e-4)


def inv_rope_fp8_quant(a):
    T, H, D = a.o.shape
    blocks = unquantized_blocks(a)
    scale = ue8m0_scale(blocks.abs().amax(-1).clamp_min(AMAX_FLOOR))[0]
    values = to_fp8(blocks / scale[..., None]).reshape(T, a.n_groups, H // a.n_groups * D)
    return values, scale


def unquantized_blocks(a):
    """The fp32 values the quantizer rounds, ``[T, G, H / G * D / block, block]``: ``o`` rotated by
    the negative angle."""
    T, H, D = a.o.shape
    cos, sin = cos_sin(a.cos_sin_cache, a.positions)
    x = rotate(a.o.to(torch.float32), cos[:, None], -sin[:, None])
    return x.reshape(T, a.n_groups, H // a.n_groups * D // a.block, a.block)
