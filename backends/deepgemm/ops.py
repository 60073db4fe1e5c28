"""dsv4ops paged_mqa_logits / mqa_logits / fp8_einsum -> DeepGEMM (SM90 recipe: fp32 scales)."""
from __future__ import annotations

import torch

from dsv4ops.backend_support import dense
from dsv4ops.platform import multiprocessors
from dsv4ops.rows import decode_row_ends


def paged_mqa_logits(a):
    """Both API generations; 1-D lengths are expanded to the 2-D form this build requires; weights and
    block_table are passed dense (the dsv4ops contract accepts any strides)."""
    import deep_gemm

    B, next_n = a.q.shape[:2]
    rows = B * next_n
    weights, table = dense(a.weights), dense(a.block_table)
    limits = decode_row_ends(a.context_lens, next_n)
    if B == 0 or a.max_context_len == 0:
        result = torch.empty(rows, a.max_context_len, device=a.q.device)
        return result if a.out is None else a.out
    ctx = limits.view(B, next_n).to(torch.int32)
    meta = deep_gemm.get_paged_mqa_logits_metadata(ctx, a.kv_cache.shape[1], multiprocessors(a.q.device))
    if hasattr(deep_gemm, "fp8_fp4_paged_mqa_logits"):
        logits = deep_gemm.fp8_fp4_paged_mqa_logits((a.q, None), a.kv_cache, weights, ctx, table, meta,
                                                    a.max_context_len)
    else:
        logits = deep_gemm.fp8_paged_mqa_logits(a.q, a.kv_cache, weights, ctx, table, meta, a.max_context_len,
                                                False)
    logits = logits[:, :a.max_context_len]
    if a.clean:
        cols = torch.arange(a.max_context_len, device=a.q.device)
        logits = logits.masked_fill(cols[None, :] >= limits[:, None], float("-inf"))
    if a.out is None:
        return logits.contiguous()
    return a.out.copy_(logits)


def _tma_ready(t: torch.Tensor) -> torch.Tensor:
    """``t`` dense and 16-byte aligned, as DeepGEMM's TMA descriptors need (a copy only when it is not:
    a slice of a larger tensor may start anywhere)."""
    t = t.contiguous()
    return t if t.data_ptr() % 16 == 0 else t.clone()


def mqa_logits(a):
    """fp8_fp4_mqa_logits ((q, None): FP8 q) where the build has it, else the legacy fp8_mqa_logits;
    both return a [T, S] view of a row-padded allocation, copied into the contiguous result. clean maps
    to clean_logits (-inf outside [ks, ke), fused by DeepGEMM)."""
    import deep_gemm

    T, S = a.q.shape[0], a.k.shape[0]
    if T == 0 or S == 0:
        return torch.empty(T, S, device=a.q.device) if a.out is None else a.out
    kv = (a.k, _tma_ready(a.k_scale))
    weights, ks, ke = _tma_ready(a.weights), a.ks.contiguous(), a.ke.contiguous()
    if hasattr(deep_gemm, "fp8_fp4_mqa_logits"):
        logits = deep_gemm.fp8_fp4_mqa_logits((a.q, None), kv, weights, ks, ke, a.clean)
    else:
        logits = deep_gemm.fp8_mqa_logits(a.q, kv, weights, ks, ke, a.clean)
    if a.out is None:
        return logits.contiguous()
    return a.out.copy_(logits)


def mn_major_scales(a_scale: torch.Tensor) -> torch.Tensor:
    """fp32 [B, H, K/128] -> the same values with DeepGEMM's SM90 TMA-aligned MN-major strides
    ``(1, (K/128) * B_al, B_al)``, ``B_al = round_up(B, 4)``."""
    B, H, kb = a_scale.shape
    b_al = (B + 3) // 4 * 4
    buf = torch.zeros(H, kb, b_al, dtype=torch.float32, device=a_scale.device)
    view = buf.permute(2, 0, 1)[:B]
    view.copy_(a_scale)
    return view


def fp8_einsum(args):
    import deep_gemm

    B, H, _ = args.a.shape
    D = args.b.shape[1]
    d = torch.empty(B, H, D, dtype=args.out_dtype, device=args.a.device) if args.out is None else args.out
    if B == 0:
        return d
    if args.a.shape[2] == 0:                # R = 0: an empty sum; DeepGEMM is not asked for K = 0
        return d.zero_()
    deep_gemm.fp8_einsum(args.equation, (args.a, mn_major_scales(args.a_scale)), (args.b, dense(args.b_scale)), d)
    return d
