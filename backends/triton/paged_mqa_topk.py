"""Triton op 12: paged_mqa_topk, on one of two paths (``tuning.fused_chunk_budget``).

Chunks (the default while one request's logits fit ``fused_chunk_bytes``, and any ``topk`` too
large for the fused kernel): this backend's logits and top-k kernels over chunks of requests whose
logits fit the budget (or one request's rows, when larger).

The fused kernel, selecting while it scores (streaming_topk.py): stage 1, program (request row,
piece): the row's key tiles ``piece, piece + pieces, ...`` are scored as paged_mqa_logits scores
them (``key_tile``, ``tile_logits``: both fp8 paths, fp8 and MXFP4 keys) and offered to the piece's
bounded candidate buffer; stage 2 merges the pieces per row. Nothing the size of ``[rows,
max_context_len]`` is allocated."""
from __future__ import annotations

import triton
import triton.language as tl

from dsv4ops import composition, registry

from . import streaming_topk
from .indexer_topk import indexer_topk
from .paged_mqa_logits import key_tile, paged_mqa_logits, queries, row_limits, tile_logits
from .streaming_topk import finish, live_keys, offer
from .tuning import Target, fused_chunk_budget, tuning


@triton.jit(do_not_specialize=["stride_t0"], do_not_specialize_on_alignment=["lens_ptr", "table_ptr"])
def _score_and_keep_kernel(q_ptr, q_scale_ptr, cache_ptr, w_ptr, lens_ptr, table_ptr, ws_ptr, H, next_n, k,
                           block_size, page_stride, stride_w0, stride_w1, stride_l0, stride_l1, stride_t0,
                           stride_t1, LENS_2D: tl.constexpr, H_PAD: tl.constexpr, BLOCK_T: tl.constexpr,
                           FP8_SOFT: tl.constexpr, KEYS_MXFP4: tl.constexpr, Q_MXFP4: tl.constexpr,
                           CAP: tl.constexpr, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    piece = tl.program_id(1)
    pieces = tl.num_programs(1)
    b = row // next_n
    end = row_limits(lens_ptr, b, tl.program_id(0) % next_n, next_n, stride_l0, stride_l1, LENS_2D)
    buf = ws_ptr + (row * pieces + piece) * (2 * CAP)
    count = 0
    threshold = tl.zeros((), tl.uint32)
    for t0 in range(piece * BLOCK_T, end, pieces * BLOCK_T):
        t = t0 + tl.arange(0, BLOCK_T)
        live = t < end
        keys, scale = key_tile(cache_ptr, table_ptr, b, t, live, block_size, page_stride, stride_t0, stride_t1,
                               BLOCK_T, FP8_SOFT, KEYS_MXFP4)
        logits = tile_logits(keys, scale, q_ptr, q_scale_ptr, w_ptr, row, H, stride_w0, stride_w1, H_PAD,
                             FP8_SOFT, KEYS_MXFP4, Q_MXFP4)
        count, threshold = offer(buf, count, threshold, live_keys(logits, live), t, k, CAP, BLOCK)
    finish(buf, count, k, CAP, BLOCK)


def paged_mqa_topk(target: Target, a):
    B, next_n, H, _ = a.q.shape
    out, answered = composition.paged_output(a)
    if answered:
        return out
    tile = target.tuning.logits_block_t
    tune = target.tuning
    budget = fused_chunk_budget(tune, a.topk, tile, next_n * a.max_context_len * 4, tune.fused_chunk_bytes)
    if budget is not None:
        return _chunked(target, a, out, budget)
    plan, ws = streaming_topk.workspace(target, B * next_n, a.topk, tile, a.q.device)
    q, keys_mxfp4, q_mxfp4, h_pad = queries(target, a)
    lens = a.context_lens
    _score_and_keep_kernel[(B * next_n, plan.pieces)](
        q, a.q_scale, a.kv_cache, a.weights, lens, a.block_table, ws, H, next_n, a.topk,
        a.kv_cache.shape[1], a.kv_cache.stride(0), a.weights.stride(0), a.weights.stride(1), lens.stride(0),
        lens.stride(-1), a.block_table.stride(0), a.block_table.stride(1), LENS_2D=lens.dim() == 2, H_PAD=h_pad,
        BLOCK_T=tile, FP8_SOFT=target.fp8_soft, KEYS_MXFP4=keys_mxfp4, Q_MXFP4=q_mxfp4, CAP=plan.cap,
        BLOCK=plan.block, num_warps=target.tuning.logits_warps)
    return streaming_topk.merge(target, plan, ws, a.topk, out)


def _chunked(target: Target, a, out, budget: int):
    """The composition over chunks of requests whose logits fit ``budget`` bytes (this backend's kernels)."""
    logits_args, topk_args = registry.get_op("paged_mqa_logits").Args, registry.get_op("indexer_topk").Args
    for logits_kw, topk_kw in composition.paged_steps(a, out, budget):
        indexer_topk(target, topk_args(logits=paged_mqa_logits(target, logits_args(**logits_kw)), **topk_kw))
    return out


def warmup_calls(dims, limits, machine) -> list[dict]:
    """Warm-up (``dsv4ops.warmup``): requests whose logits fit ``fused_chunk_bytes`` run logits and
    top-k in chunks (their variants are those two ops'); longer ones, where the limits allow them,
    the fused kernel, at a call per pieces count of its plan (``fused_topk_rows``) and lengths' form."""
    tune, n, k = tuning(machine.platform), limits.next_n, dims.index_topk
    contexts = [2 * limits.c4_block]
    if n * limits.index_width * 4 > tune.fused_chunk_bytes:
        contexts.append(limits.index_width)
    rows = streaming_topk.fused_topk_rows(k, tune.logits_block_t, limits.max_tokens, tune, machine.sms, n)
    return [dict(B=r // n, next_n=n, context=c, H=dims.index_heads, block_size=limits.c4_block, lens_dim=d, topk=k)
            for c in contexts for r in rows for d in (1, 2)]
