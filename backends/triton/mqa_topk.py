"""Triton op 13: mqa_topk, on paged_mqa_topk's two paths (``tuning.fused_chunk_budget``).

Chunks (the default while one query row's logits fit ``fused_prefill_chunk_bytes``, and any
``topk`` too large for the fused kernel): this backend's logits and top-k kernels over chunks of
query rows whose logits fit the budget (or one row, when larger).

The fused kernel, selecting while it scores (streaming_topk.py): stage 1, program (query row,
piece): the tiles ``piece, piece + pieces, ...`` of the row's key range ``[ks, ke)`` are scored as
mqa_logits scores them (``query_block`` of one row, ``tile_logits``: both fp8 paths, fp8 and MXFP4
keys) and offered to the piece's candidate buffer; stage 2 merges the pieces and writes columns
relative to ``ks``. On the software fp8 path q and k are decoded once (2 bytes an element), as
mqa_logits does."""
from __future__ import annotations

import triton
import triton.language as tl

from dsv4ops import composition, registry

from . import streaming_topk
from .indexer_topk import indexer_topk
from .mqa_logits import mqa_logits, operands, query_block, tile_logits
from .streaming_topk import finish, live_keys, offer
from .tuning import Target, fused_chunk_budget, tuning


@triton.jit(do_not_specialize=["T"], do_not_specialize_on_alignment=["ks_ptr", "ke_ptr"])
def _score_and_keep_kernel(q_ptr, q_scale_ptr, k_ptr, scale_ptr, w_ptr, ks_ptr, ke_ptr, ws_ptr, T, H, k,
                           stride_w0, stride_w1, stride_ks, stride_ke, H_PAD: tl.constexpr, BLOCK_S: tl.constexpr,
                           FP8_SOFT: tl.constexpr, KEYS_MXFP4: tl.constexpr, Q_MXFP4: tl.constexpr,
                           CAP: tl.constexpr, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    piece = tl.program_id(1)
    pieces = tl.num_programs(1)
    start = tl.load(ks_ptr + row * stride_ks)
    end = tl.load(ke_ptr + row * stride_ke)
    buf = ws_ptr + (row * pieces + piece) * (2 * CAP)
    count = 0
    threshold = tl.zeros((), tl.uint32)
    q, w = query_block(q_ptr, q_scale_ptr, w_ptr, row, T, H, stride_w0, stride_w1, 1, H_PAD, FP8_SOFT, KEYS_MXFP4,
                       Q_MXFP4)
    for s0 in range(start + piece * BLOCK_S, end, pieces * BLOCK_S):
        s = s0 + tl.arange(0, BLOCK_S)
        live = s < end
        logits = tl.reshape(tile_logits(k_ptr, scale_ptr, s, live, q, w, BLOCK_S, 1, H_PAD, FP8_SOFT, KEYS_MXFP4),
                            (BLOCK_S,))
        count, threshold = offer(buf, count, threshold, live_keys(logits, live), s, k, CAP, BLOCK)
    finish(buf, count, k, CAP, BLOCK)


def mqa_topk(target: Target, a):
    T, H, S = a.q.shape[0], a.q.shape[1], a.k.shape[0]
    out, answered = composition.prefill_output(a)
    if answered:
        return out
    tile = target.tuning.mqa_block_s
    tune = target.tuning
    budget = fused_chunk_budget(tune, a.topk, tile, S * 4, tune.fused_prefill_chunk_bytes)
    if budget is not None:
        return _chunked(target, a, out, budget)
    plan, ws = streaming_topk.workspace(target, T, a.topk, tile, a.q.device)
    q, k, keys_mxfp4, q_mxfp4, h_pad = operands(target, a)
    _score_and_keep_kernel[(T, plan.pieces)](
        q, a.q_scale, k, a.k_scale, a.weights, a.ks, a.ke, ws, T, H, a.topk, a.weights.stride(0),
        a.weights.stride(1), a.ks.stride(0), a.ke.stride(0), H_PAD=h_pad, BLOCK_S=tile, FP8_SOFT=target.fp8_soft,
        KEYS_MXFP4=keys_mxfp4, Q_MXFP4=q_mxfp4, CAP=plan.cap, BLOCK=plan.block, num_warps=target.tuning.mqa_warps)
    return streaming_topk.merge(target, plan, ws, a.topk, out, starts=a.ks)


def _chunked(target: Target, a, out, budget: int):
    """The composition over chunks of query rows whose logits fit ``budget`` bytes (this backend's kernels)."""
    logits_args, topk_args = registry.get_op("mqa_logits").Args, registry.get_op("indexer_topk").Args
    for logits_kw, topk_kw in composition.prefill_steps(a, out, budget):
        indexer_topk(target, topk_args(logits=mqa_logits(target, logits_args(**logits_kw)), **topk_kw))
    return out


def warmup_calls(dims, limits, machine) -> list[dict]:
    """Warm-up (``dsv4ops.warmup``): a call per pieces count of the fused plan (``fused_topk_rows``)."""
    tune, k = tuning(machine.platform), dims.index_topk
    return [dict(T=rows, S=256, H=dims.index_heads, topk=k)
            for rows in streaming_topk.fused_topk_rows(k, tune.mqa_block_s, limits.max_tokens, tune, machine.sms)]
