"""Reference for op 1, spec §1 "Exact math" and Decision 2."""
from __future__ import annotations

import torch

from dsv4ops import formats
from dsv4ops.quant import as_float, to_fp8

from .rope import cos_sin, rotate


def qnorm_rope_kv_insert(q, kv, positions, cos_sin_cache, kv_cache, slot_mapping, *, layout, block_size,
                         eps=1e-6, kv_scale=1.0, q_scale=1.0, out=None):
    cos, sin = cos_sin(cos_sin_cache, positions)

    # Q: weightless RMSNorm over all 512 dims in fp32, RoPE on the fp32 normalized values, one rounding.
    x = q.to(torch.float32)
    y = x * torch.rsqrt(x.square().mean(-1, keepdim=True) + eps)
    q_rot = rotate(y, cos[:, None], sin[:, None]).to(torch.bfloat16)

    # KV: NoPE half is the original bf16; the rotated RoPE half is rounded to bf16 before storage.
    k = rotate(kv.to(torch.float32), cos, sin).to(torch.bfloat16).to(torch.float32)
    n_kv = slot_mapping.shape[0]                                   # DP padding: T' <= T
    formats.write_kv(kv_cache, layout, block_size, slot_mapping, k[:n_kv], kv_scale)

    if layout == "fp8_per_tensor":                                 # Decision 2: q is left unmodified
        q_fp8 = to_fp8(q_rot.to(torch.float32) / as_float(q_scale))
        return q_fp8 if out is None else out.copy_(q_fp8)
    target = q if out is None else out
    return target.copy_(q_rot)
