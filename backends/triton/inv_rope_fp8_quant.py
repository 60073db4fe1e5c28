"""Triton inv_rope_fp8_quant (docs/ops.md §8): grid (T, cdiv(H, HEADS)); each program reads HEADS
heads of one token once (bf16), un-rotates the RoPE pairs in registers and writes the fp8 values
and 512 / BLOCK power-of-two scales per head (BLOCK 128 or 32). The result [T, G, K] is
[T, H, 512] in memory, so head h of token t lands at row t * H + h of both outputs."""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from dsv4ops.quant import FP8_MAX

from .common import ceil_log2, exp2_int, fp8_bytes, to_e4m3
from .tuning import Target


@triton.jit
def _inv_rope_fp8_quant_kernel(o_ptr, stride_t, stride_h, pos_ptr, pos_stride, cs_ptr, a_ptr, s_ptr, H,
                               HEADS: tl.constexpr, BLOCK: tl.constexpr, FP8_MAX: tl.constexpr,
                               FP8_SOFT: tl.constexpr):
    t = tl.program_id(0).to(tl.int64)
    h = tl.program_id(1) * HEADS + tl.arange(0, HEADS)
    live = (h < H)[:, None]
    d = tl.arange(0, 512)
    rope = d >= 448
    row = o_ptr + t * stride_t + h.to(tl.int64)[:, None] * stride_h
    x = tl.load(row + d[None, :], mask=live, other=0.0).to(tl.float32)
    partner = tl.load(row + (d ^ 1)[None, :], mask=live & rope[None, :], other=0.0).to(tl.float32)
    pos = tl.load(pos_ptr + t * pos_stride)
    pair = tl.maximum(d - 448, 0) // 2
    cos = tl.load(cs_ptr + pos * 64 + pair, mask=rope, other=1.0)
    sin = tl.load(cs_ptr + pos * 64 + 32 + pair, mask=rope, other=0.0)
    even = (d % 2) == 0
    # inverse rotation: even' = e cos + o sin, odd' = o cos - e sin; NoPE dims pass through
    y = tl.where(rope[None, :], x * cos[None, :] + partner * tl.where(even, sin, -sin)[None, :], x)
    NB: tl.constexpr = 512 // BLOCK
    blocks = tl.reshape(y, (HEADS, NB, BLOCK))
    amax = tl.maximum(tl.max(tl.abs(blocks), axis=2), 1e-10)
    ex = ceil_log2(amax / FP8_MAX)
    q = to_e4m3(blocks * exp2_int(-ex)[:, :, None], FP8_MAX, False, FP8_SOFT)
    out_row = t * H + h.to(tl.int64)
    tl.store(a_ptr + out_row[:, None] * 512 + d[None, :], tl.reshape(q, (HEADS, 512)), mask=live)
    tl.store(s_ptr + out_row[:, None] * NB + tl.arange(0, NB)[None, :], exp2_int(ex), mask=live)


def inv_rope_fp8_quant(target: Target, a):
    T, H, D = a.o.shape
    G = a.n_groups
    values = torch.empty(T, G, H // G * D, dtype=torch.float8_e4m3fn, device=a.o.device)
    scales = torch.empty(T, G, H // G * D // a.block, dtype=torch.float32, device=a.o.device)
    if T == 0:
        return values, scales
    tune = target.tuning
    heads = min(tune.inv_rope_heads, triton.next_power_of_2(H))
    _inv_rope_fp8_quant_kernel[(T, triton.cdiv(H, heads))](
        a.o, a.o.stride(0), a.o.stride(1), a.positions, a.positions.stride(0), a.cos_sin_cache,
        fp8_bytes(values, target.fp8_soft), scales, H, HEADS=heads, BLOCK=a.block, FP8_MAX=FP8_MAX["ocp"],
        FP8_SOFT=target.fp8_soft, num_warps=tune.inv_rope_warps,
    )
    return values, scales


def warmup_calls(dims, limits, machine) -> list[dict]:
    """Warm-up (``dsv4ops.warmup``): one call (T is not specialized)."""
    return [dict(T=2, H=dims.heads, n_groups=dims.o_groups)]
