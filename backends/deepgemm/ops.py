"""dsv4ops paged_mqa_logits / fp8_einsum -> DeepGEMM (SM90 recipe: fp32 scales)."""
from __future__ import annotations

import torch

from dsv4ops.ops._rows import decode_row_ends
from dsv4ops.platform import multiprocessors


def paged_mqa_logits(q, kv_cache, weights, context_lens, block_table, max_context_len, *, clean=False,
                     out=None):
    """Both API generations; 1-D lengths are expanded to the 2-D form this build requires."""
    import deep_gemm

    B, next_n = q.shape[:2]
    rows = B * next_n
    limits = decode_row_ends(context_lens, next_n)
    if B == 0 or max_context_len == 0:
        result = torch.empty(rows, max_context_len, device=q.device)
        return result if out is None else out
    ctx = limits.view(B, next_n).to(torch.int32)
    meta = deep_gemm.get_paged_mqa_logits_metadata(ctx, kv_cache.shape[1], multiprocessors(q.device))
    if hasattr(deep_gemm, "fp8_fp4_paged_mqa_logits"):
        logits = deep_gemm.fp8_fp4_paged_mqa_logits((q, None), kv_cache, weights, ctx, block_table, meta,
                                                    max_context_len)
    else:
        logits = deep_gemm.fp8_paged_mqa_logits(q, kv_cache, weights, ctx, block_table, meta, max_context_len,
                                                False)
    logits = logits[:, :max_context_len]
    if clean:
        cols = torch.arange(max_context_len, device=q.device)
        logits = logits.masked_fill(cols[None, :] >= limits[:, None], float("-inf"))
    if out is None:
        return logits.contiguous()
    return out.copy_(logits)


def mn_major_scales(a_scale: torch.Tensor) -> torch.Tensor:
    """fp32 [B, H, K/128] -> the same values with DeepGEMM's SM90 TMA-aligned MN-major strides
    ``(1, (K/128) * B_al, B_al)``, ``B_al = round_up(B, 4)``."""
    B, H, kb = a_scale.shape
    b_al = (B + 3) // 4 * 4
    buf = torch.zeros(H, kb, b_al, dtype=torch.float32, device=a_scale.device)
    view = buf.permute(2, 0, 1)[:B]
    view.copy_(a_scale)
    return view


def fp8_einsum(equation, a, a_scale, b, b_scale, *, out=None, out_dtype=torch.bfloat16):
    import deep_gemm

    B, H, _ = a.shape
    D = b.shape[1]
    d = torch.empty(B, H, D, dtype=out_dtype, device=a.device) if out is None else out
    if B == 0:
        return d
    deep_gemm.fp8_einsum(equation, (a, mn_major_scales(a_scale)), (b, b_scale), d)
    return d
