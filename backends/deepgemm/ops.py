"""dsv4ops paged_mqa_logits / mqa_logits / fp8_einsum -> DeepGEMM (SM90 recipe: fp32 scales), each API
generation called with its own parameter list (``api()``)."""
from __future__ import annotations

import torch

from dsv4ops.backend_support import dense
from dsv4ops.platform import multiprocessors
from dsv4ops.quant import scale_block
from dsv4ops.rows import decode_row_ends

from . import api


def paged_mqa_logits(a):
    """1-D lengths are expanded to the 2-D form DeepGEMM requires; weights and block_table are passed dense
    (the dsv4ops contract accepts any strides). No generation cleans the tail here: the adapter does."""
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
    if api() == "legacy":
        logits = deep_gemm.fp8_paged_mqa_logits(a.q, a.kv_cache, weights, ctx, table, meta, a.max_context_len,
                                                False)
    else:                       # 2.5, 2.8.0 and 2.8 share these seven (clean_logits defaults to False)
        logits = deep_gemm.fp8_fp4_paged_mqa_logits((a.q, None), a.kv_cache, weights, ctx, table, meta,
                                                    a.max_context_len)
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
    """API 2.5 / 2.8.0 / legacy: ``clean`` maps to clean_logits (cleaned in the kernel); the [T, S] view of a
    row-padded allocation is copied into the contiguous result. API 2.8 returns compressed rows only
    (column c is key ks + c, tail not cleaned): ``max_seqlen_k = S`` bounds every span without a host
    sync (0 <= ks <= ke <= S), and the rows are moved to absolute columns (``_absolute_columns``)."""
    import deep_gemm

    T, S = a.q.shape[0], a.k.shape[0]
    out = torch.empty(T, S, device=a.q.device) if a.out is None else a.out
    if T == 0 or S == 0:
        return out
    kv = (a.k, _tma_ready(a.k_scale))
    weights, ks, ke = _tma_ready(a.weights), a.ks.contiguous(), a.ke.contiguous()
    generation = api()
    if generation == "2.8":
        rows = deep_gemm.fp8_fp4_mqa_logits((a.q, None), kv, weights, ks, ke, S)
        return _absolute_columns(rows, ks, ke, a.clean, out)
    if generation in ("2.5", "2.8.0"):
        logits = deep_gemm.fp8_fp4_mqa_logits((a.q, None), kv, weights, ks, ke, a.clean)
    else:
        logits = deep_gemm.fp8_mqa_logits(a.q, kv, weights, ks, ke, a.clean)
    return out.copy_(logits)


_GATHER_ELEMENTS = 1 << 24      # int64 index elements per chunk of rows (128 MiB)


def _absolute_columns(rows: torch.Tensor, ks: torch.Tensor, ke: torch.Tensor, clean: bool,
                      out: torch.Tensor) -> torch.Tensor:
    """Compressed fp32 rows ``[T, S]`` (column c = key ks + c, valid for c < ke - ks) -> ``out`` fp32
    ``[T, S]`` indexed by key; with ``clean`` every column outside ``[ks, ke)`` is -inf. Row chunks bound
    the gather index's memory."""
    T, S = out.shape
    cols = torch.arange(S, device=out.device)
    step = max(1, _GATHER_ELEMENTS // S)
    for r in range(0, T, step):
        shift = cols[None, :] - ks[r:r + step, None]                 # the compressed column of each key
        torch.gather(rows[r:r + step], 1, shift.clamp(0, S - 1), out=out[r:r + step])
        if clean:
            span = (ke[r:r + step] - ks[r:r + step])[:, None]
            out[r:r + step].masked_fill_((shift < 0) | (shift >= span), float("-inf"))
    return out


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
    """128-wide blocks: the SM90 recipe (1, 128, 128), ``a_scale`` in its MN-major form, ``b_scale`` dense.
    32-wide blocks: the SM100 recipe (1, 32, 32); DeepGEMM packs both fp32 scale tensors (any strides)
    into UE8M0 itself."""
    import deep_gemm

    B, H, R = args.a.shape
    D = args.b.shape[1]
    d = torch.empty(B, H, D, dtype=args.out_dtype, device=args.a.device) if args.out is None else args.out
    if B == 0:
        return d
    if R == 0:                              # an empty sum; DeepGEMM is not asked for K = 0
        return d.zero_()
    block = scale_block(D, R, args.b_scale.shape[1:])
    if block == 128:
        deep_gemm.fp8_einsum(args.equation, (args.a, mn_major_scales(args.a_scale)), (args.b, dense(args.b_scale)), d)
    else:
        deep_gemm.fp8_einsum(args.equation, (args.a, args.a_scale), (args.b, args.b_scale), d,
                             recipe=(1, block, block))
    return d
