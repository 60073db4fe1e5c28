"""dsv4ops mqa_logits -> ``aiter.ops.triton.attention.fp8_mqa_logits.fp8_mqa_logits`` (AITER v0.1.20
signature ``(Q, KV, kv_scales, weights, cu_starts, cu_ends, clean_logits=True) -> logits``).

- The arguments map one to one (Q [T, H, 128], KV [S, 128], kv_scales [S], weights [T, H],
  cu_starts / cu_ends [T] = ks / ke). The Triton kernel reads cu_starts / cu_ends with unit stride,
  so they are passed dense.
- gfx942 (Triton kernel): OCP inputs are recast to FNUZ by AITER (values x 0.5, scales x 4; exact),
  FNUZ inputs are read as they are. gfx950 (Gluon kernel): OCP inputs only (capability check).
- The result is a [T, S] view of a 256-column-aligned allocation: copied into the contiguous result.
  ``clean_logits=False`` leaves columns outside [ks, ke) uninitialised (the contract's unspecified).
"""
from __future__ import annotations

import torch

from dsv4ops.platform import Platform


def mqa_logits(plat: Platform, a):
    from aiter.ops.triton.attention.fp8_mqa_logits import fp8_mqa_logits

    T, S = a.q.shape[0], a.k.shape[0]
    if T == 0 or S == 0:
        return torch.empty(T, S, device=a.q.device) if a.out is None else a.out
    logits = fp8_mqa_logits(a.q, a.k, a.k_scale, a.weights, a.ks.contiguous(), a.ke.contiguous(),
                            clean_logits=a.clean)
    if a.out is None:
        return logits.contiguous()
    return a.out.copy_(logits)
