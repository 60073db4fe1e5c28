"""Reference for op 1, docs/ops.md §1 "Exact math"."""
from __future__ import annotations

import torch

from dsv4ops import formats
from dsv4ops.quant import as_float, to_fp8

from .rope import cos_sin, rotate


def qnorm_rope_kv_insert(a):
    cos, sin = cos_sin(a.cos_sin_cache, a.positions)

    # Q: weightless RMSNorm over all 512 dims in fp32, RoPE on the fp32 normalized values, one rounding.
    x = a.q.to(torch.float32)
    y = x * torch.rsqrt(x.square().mean(-1, keepdim=True) + a.eps)
    q_rot = rotate(y, cos[:, None], sin[:, None]).to(torch.bfloat16)

    k = cache_rows(a)
    n_kv = a.slot_mapping.shape[0]                                   # DP padding: T' <= T
    formats.write_kv(a.kv_cache, a.layout, a.block_size, a.slot_mapping, k[:n_kv], a.kv_scale)

    if a.layout.has_tensor_scale:                     # docs/ops.md §1: q itself is left unmodified
        q_fp8 = to_fp8(q_rot.to(torch.float32) / as_float(a.q_scale))
        return q_fp8 if a.out is None else a.out.copy_(q_fp8)
    target = a.q if a.out is None else a.out
    return target.copy_(q_rot)


def cache_rows(a):
    """The fp32 rows ``[T, 512]`` the cache writer quantizes: the NoPE half is the original bf16, the
    rotated RoPE half is rounded to bf16 before storage."""
    cos, sin = cos_sin(a.cos_sin_cache, a.positions)
    return rotate(a.kv.to(torch.float32), cos, sin).to(torch.bfloat16).to(torch.float32)
