"""Triton op 2: sparse MQA decode that reads each selected cache row once per (token, head block),
dequantizes it in registers and serves all heads of the block from it (online softmax, base 2).

Grid (T x head blocks, splits), the head blocks of one token adjacent (they read the same rows,
which then come from L2). When T x head blocks cannot fill the GPU, the combined index list (SWA
segment, then extra segment) is split across programs and a second kernel merges the partial
results by their log-sum-exp; the sink and the lonely-row rule are applied at the end.
sparse_mla_prefill (sparse_mla_prefill.py) runs the same kernels with its own tile sizes.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from dsv4ops.backend_support import decode_output
from dsv4ops.platform import multiprocessors

from .common import (
    e4m3_to_f32, fp8_bytes, load_scalar, mxfp8_decode, nvfp4_decode, scalar_arg, ue8m0_decode, v41_record_offsets,
)
from .tuning import Target


@triton.jit
def _load_rows(cache_ptr, slots, valid, block_size, page_bytes, LAYOUT: tl.constexpr, INLINE: tl.constexpr,
               FNUZ: tl.constexpr, BLOCK_K: tl.constexpr, FP8_SOFT: tl.constexpr):
    """Rows ``[BLOCK_K, 512]`` as bf16 (fp8 values unscaled for Layout.FP8_PER_TENSOR); invalid rows are 0.

    MODEL1 rows are read as 8 tiles of 64: tiles 0-6 are fp8 scaled by their UE8M0 byte (one load
    per tile), tile 7 is the bf16 RoPE part; the dequantized values are exact in bf16. The V4.1
    records (Layout.MXFP8, Layout.NVFP4; INLINE: inline pages, else split) go through
    ``_load_v41_rows``. ``page_bytes`` is the page pitch of the byte-paged layouts. With FP8_SOFT
    the fp8 bytes (uint8) are decoded with integer operations.
    """
    ok = valid[:, None]
    if LAYOUT == 0:                        # Layout.DS_MLA
        block = (slots // block_size).to(tl.int64)
        off = (slots % block_size).to(tl.int64)
        page = cache_ptr + block * page_bytes
        tile = tl.arange(0, 8)
        col = tl.arange(0, 64)
        # 8-byte pieces of the fp8 tiles: the RoPE tile's 16-byte loads (8 bf16) then land in the
        # layout of the rows, with no exchange through shared memory (16-byte pieces need one).
        data = (page + off * 576)[:, None, None] + tile[None, :, None] * 64 + tl.max_contiguous(col, 8)[None, None, :]
        nope = (tile < 7)[None, :, None]
        raw = tl.load(data, mask=ok[:, :, None] & nope, other=0)
        fp8: tl.constexpr = tl.float8e4b8 if FNUZ else tl.float8e4nv
        scale_byte = tl.load((page + block_size * 576 + off * 8)[:, None] + tile[None, :],
                             mask=ok & (tile < 7)[None, :], other=127)
        if FP8_SOFT:
            values = e4m3_to_f32(raw) * ue8m0_decode(scale_byte)[:, :, None]
        else:
            values = raw.to(fp8, bitcast=True).to(tl.float32) * ue8m0_decode(scale_byte)[:, :, None]
        rope_ptr = (page + off * 576 + 448).to(tl.pointer_type(tl.bfloat16))
        rope = tl.load(rope_ptr[:, None] + col[None, :], mask=ok, other=0.0).to(tl.float32)
        rows = tl.where(nope, values, rope[:, None, :])
        return tl.reshape(rows, (BLOCK_K, 512)).to(tl.bfloat16)
    elif LAYOUT == 4 or LAYOUT == 5:       # Layout.MXFP8, Layout.NVFP4
        page = cache_ptr + (slots // block_size).to(tl.int64) * page_bytes
        return _load_v41_rows(page, (slots % block_size).to(tl.int64), ok, block_size, LAYOUT == 5, INLINE,
                              BLOCK_K, FP8_SOFT)
    else:
        col = tl.arange(0, 512)[None, :]
        row = cache_ptr + slots.to(tl.int64)[:, None] * 512
        return _bf16(tl.load(row + col, mask=ok, other=0.0), FP8_SOFT and LAYOUT == 2)


@triton.jit
def _load_v41_rows(page, off, ok, block_size, NVFP4: tl.constexpr, INLINE: tl.constexpr, BLOCK_K: tl.constexpr,
                   FP8_SOFT: tl.constexpr):
    """V4.1 records of page slots ``off`` (int64 ``[BLOCK_K]``) of pages ``page`` (uint8 pointers)
    -> bf16 ``[BLOCK_K, 512]``, exact (an e4m3 or e2m1 value times a power of two or an e4m3 scale);
    rows where ``ok`` ([BLOCK_K, 1]) is False are 0 (values 0, scales 1)."""
    if NVFP4:                              # 256 B of e2m1 pairs, 32 e4m3 scales
        data, scales = v41_record_offsets(off, block_size, 288, 256, INLINE)
        packed = tl.load((page + data)[:, None] + tl.arange(0, 256)[None, :], mask=ok, other=0)
        scale = tl.load((page + scales)[:, None] + tl.arange(0, 32)[None, :], mask=ok, other=0x38)
        rows = nvfp4_decode(packed, scale, BLOCK_K, FP8_SOFT)
    else:                                  # 512 e4m3 values, 16 UE8M0 scales
        data, scales = v41_record_offsets(off, block_size, 528, 512, INLINE)
        values = tl.load((page + data)[:, None] + tl.arange(0, 512)[None, :], mask=ok, other=0)
        scale = tl.load((page + scales)[:, None] + tl.arange(0, 16)[None, :], mask=ok, other=127)
        rows = mxfp8_decode(values, scale, BLOCK_K, FP8_SOFT)
    return rows.to(tl.bfloat16)


@triton.jit
def _bf16(x, E4M3_BYTES: tl.constexpr):
    """``x`` as bf16; with E4M3_BYTES ``x`` holds e4m3 bytes (the software path's fp8 tensors)."""
    if E4M3_BYTES:
        x = e4m3_to_f32(x)
    return x.to(tl.bfloat16)


@triton.jit
def _attend_block(q, m, l, acc, t, idx_ptr, idx_s0, idx_s1, length, topk, cache_ptr, block_size, page_bytes, b,
                  qk_scale, LAYOUT: tl.constexpr, INLINE: tl.constexpr, FNUZ: tl.constexpr, BLOCK_K: tl.constexpr,
                  FP8_SOFT: tl.constexpr):
    """Online-softmax step over index block ``b`` of one segment; scores in base 2."""
    j = b * BLOCK_K + tl.arange(0, BLOCK_K)
    slots = tl.load(idx_ptr + t * idx_s0 + j.to(tl.int64) * idx_s1, mask=j < topk, other=-1)
    valid = (slots != -1) & (j < length)
    k = _load_rows(cache_ptr, slots, valid, block_size, page_bytes, LAYOUT, INLINE, FNUZ, BLOCK_K, FP8_SOFT)
    # The score product sits in a branch of its own. Triton gives a product whose result feeds another
    # product all warps along its rows, so with 64 heads on 8 warps both warpgroups would compute every
    # score; a result that leaves through a branch is not seen as feeding one, and the two warpgroups
    # split the block's rows (tests/test_compile_targets.py checks the compiled products).
    if b * BLOCK_K < length:
        s = tl.dot(q, tl.trans(k)) * qk_scale
    else:                                  # no row of the block is within the length
        s = tl.full((q.shape[0], BLOCK_K), float("-inf"), tl.float32)
    s = tl.where(valid[None, :], s, float("-inf"))
    m_new = tl.maximum(m, tl.max(s, axis=1))
    m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
    alpha = tl.exp2(m - m_safe)
    p = tl.exp2(s - m_safe[:, None])
    l = l * alpha + tl.sum(p, axis=1)
    acc = acc * alpha[:, None] + tl.dot(p.to(tl.bfloat16), k)
    return m_new, l, acc


@triton.jit
def _segment_length(lens_ptr, lens_stride, t, topk, HAS_LENS: tl.constexpr):
    length = topk
    if HAS_LENS:
        length = tl.minimum(tl.load(lens_ptr + t * lens_stride), topk)
    return length


@triton.jit(do_not_specialize=["topk", "x_topk", "idx_s0", "x_idx_s0", "blocks_per_split"])
def _decode_kernel(
    q_ptr, H, cache_ptr, idx_ptr, idx_s0, idx_s1, lens_ptr, lens_s, topk, block_size, page_bytes,
    x_cache_ptr, x_idx_ptr, x_idx_s0, x_idx_s1, x_lens_ptr, x_lens_s, x_topk, x_block_size, x_page_bytes,
    sink_ptr, sink_s, out_ptr, lse_ptr, part_o_ptr, part_lse_ptr, sm_scale, q_scale, kv_scale, blocks_per_split,
    HAS_LENS: tl.constexpr, HAS_EXTRA: tl.constexpr, HAS_X_LENS: tl.constexpr, HAS_SINK: tl.constexpr,
    LAYOUT: tl.constexpr, INLINE: tl.constexpr, X_LAYOUT: tl.constexpr, X_INLINE: tl.constexpr,
    FNUZ: tl.constexpr, SPLIT: tl.constexpr, Q_SCALE_PTR: tl.constexpr,
    KV_SCALE_PTR: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_K: tl.constexpr, FP8_SOFT: tl.constexpr,
):
    head_blocks = tl.cdiv(H, BLOCK_H)
    t = (tl.program_id(0) // head_blocks).to(tl.int64)
    hb = tl.program_id(0) % head_blocks
    split = tl.program_id(1)
    heads = hb * BLOCK_H + tl.arange(0, BLOCK_H)
    live = heads < H
    col = tl.arange(0, 512)
    q = tl.load(q_ptr + (t * H + heads)[:, None] * 512 + col[None, :], mask=live[:, None], other=0.0)
    q = _bf16(q, FP8_SOFT and LAYOUT == 2)
    qk_scale = sm_scale * 1.4426950408889634
    if LAYOUT == 2:                        # Layout.FP8_PER_TENSOR
        qk_scale = qk_scale * load_scalar(q_scale, Q_SCALE_PTR) * load_scalar(kv_scale, KV_SCALE_PTR)

    m = tl.full((BLOCK_H,), float("-inf"), tl.float32)
    l = tl.zeros((BLOCK_H,), tl.float32)
    acc = tl.zeros((BLOCK_H, 512), tl.float32)
    n_main = tl.cdiv(topk, BLOCK_K)
    length = _segment_length(lens_ptr, lens_s, t, topk, HAS_LENS)
    x_length = _segment_length(x_lens_ptr, x_lens_s, t, x_topk, HAS_X_LENS)
    # This program's share of the combined block list (SWA blocks, then extra blocks), one loop with a
    # branch per block: a second loop per segment costs registers the accumulator needs, and measured
    # slower (docs/perf/README.md, "Triton defaults on sm90").
    for i in range(0, blocks_per_split):
        b = split * blocks_per_split + i
        if b < n_main:
            m, l, acc = _attend_block(q, m, l, acc, t, idx_ptr, idx_s0, idx_s1, length, topk, cache_ptr,
                                      block_size, page_bytes, b, qk_scale, LAYOUT, INLINE, FNUZ, BLOCK_K, FP8_SOFT)
        elif HAS_EXTRA:
            if b - n_main < tl.cdiv(x_topk, BLOCK_K):
                m, l, acc = _attend_block(q, m, l, acc, t, x_idx_ptr, x_idx_s0, x_idx_s1, x_length, x_topk,
                                          x_cache_ptr, x_block_size, x_page_bytes, b - n_main, qk_scale, X_LAYOUT,
                                          X_INLINE, FNUZ, BLOCK_K, FP8_SOFT)

    empty = l == 0.0
    o = acc / tl.where(empty, 1.0, l)[:, None]
    if LAYOUT == 2:                        # Layout.FP8_PER_TENSOR
        o = o * load_scalar(kv_scale, KV_SCALE_PTR)
    lse = tl.where(empty, float("-inf"), (m + tl.log2(tl.where(empty, 1.0, l))) * 0.6931471805599453)
    if SPLIT:
        row = (t * H + heads) * tl.num_programs(1) + split
        tl.store(part_o_ptr + row[:, None] * 512 + col[None, :], o, mask=live[:, None])
        tl.store(part_lse_ptr + row, lse, mask=live)
    else:
        _finish(o, lse, empty, heads, live, t, H, sink_ptr, sink_s, out_ptr, lse_ptr, HAS_SINK)


@triton.jit
def _finish(o, lse, empty, heads, live, t, H, sink_ptr, sink_s, out_ptr, lse_ptr, HAS_SINK: tl.constexpr):
    """Apply the sink (lse excludes it) and the lonely-row rule; write bf16 out and fp32 lse."""
    if HAS_SINK:
        sink = tl.load(sink_ptr + heads * sink_s, mask=live, other=float("-inf"))
        o = o / (1.0 + tl.exp(tl.where(empty, 0.0, sink - lse)))[:, None]
    o = tl.where(empty[:, None], 0.0, o)
    col = tl.arange(0, 512)
    tl.store(out_ptr + (t * H + heads)[:, None] * 512 + col[None, :], o.to(tl.bfloat16), mask=live[:, None])
    tl.store(lse_ptr + t * H + heads, tl.where(empty, float("inf"), lse), mask=live)


@triton.jit(do_not_specialize=["n_splits"])
def _combine_kernel(part_o_ptr, part_lse_ptr, sink_ptr, sink_s, out_ptr, lse_ptr, H, n_splits,
                    HAS_SINK: tl.constexpr, BLOCK_H: tl.constexpr):
    t = tl.program_id(0).to(tl.int64)
    heads = tl.program_id(1) * BLOCK_H + tl.arange(0, BLOCK_H)
    live = heads < H
    col = tl.arange(0, 512)
    m = tl.full((BLOCK_H,), float("-inf"), tl.float32)
    for s in range(n_splits):
        m = tl.maximum(m, tl.load(part_lse_ptr + (t * H + heads) * n_splits + s, mask=live, other=float("-inf")))
    m_safe = tl.where(m == float("-inf"), 0.0, m)
    total = tl.zeros((BLOCK_H,), tl.float32)
    o = tl.zeros((BLOCK_H, 512), tl.float32)
    for s in range(n_splits):
        row = (t * H + heads) * n_splits + s
        w = tl.exp(tl.load(part_lse_ptr + row, mask=live, other=float("-inf")) - m_safe)
        total += w
        o += w[:, None] * tl.load(part_o_ptr + row[:, None] * 512 + col[None, :], mask=live[:, None] & (w[:, None] > 0),
                                  other=0.0)
    empty = total == 0.0
    o = o / tl.where(empty, 1.0, total)[:, None]
    lse = tl.where(empty, float("-inf"), m_safe + tl.log(tl.where(empty, 1.0, total)))
    _finish(o, lse, empty, heads, live, t, H, sink_ptr, sink_s, out_ptr, lse_ptr, HAS_SINK)


def choose_splits(T: int, head_blocks: int, index_blocks: int, device: torch.device, waves: int) -> int:
    """Split the index list only when T x head blocks leaves most multiprocessors idle, aiming at
    ``waves`` programs per multiprocessor (one program fits per SM at 64 heads: docs/perf)."""
    programs = T * head_blocks
    sms = multiprocessors(device)
    if programs >= sms or index_blocks <= 1:
        return 1
    return max(1, min(index_blocks, (waves * sms) // programs))


def sparse_mla_decode(target: Target, a):
    tune = target.tuning
    return attend(a, tune.decode_block_h, tune.decode_block_k, tune.decode_warps, tune.decode_stages,
                  tune.decode_waves, target.fp8_soft)


def attend(a, BLOCK_H: int, BLOCK_K: int, warps: int, stages: int, waves: int, soft: bool):
    """Run the kernels on typed args ``a`` (sparse_mla_decode's or sparse_mla_prefill's, which are the
    same) with the given tiles (``BLOCK_K`` halved when the two caches have different layouts) and
    fp8 path; returns (out bf16 [T, H, 512], lse fp32 [T, H] or None)."""
    T, H, _ = a.q.shape
    out = decode_output(a.q, a.out)
    lse = torch.empty(T, H, dtype=torch.float32, device=a.q.device)
    if T == 0:
        return out, lse if a.need_lse else None
    layout = a.layout
    has_extra = a.extra_kv_cache is not None
    x_layout = a.extra_layout if has_extra else layout
    if x_layout != layout:                 # two row decoders in the loop: half the rows per step (docs/perf)
        BLOCK_K = max(16, BLOCK_K // 2)
    page = a.kv_cache.stride(0) if layout.is_paged_bytes else 0            # the page pitch
    x_page = a.extra_kv_cache.stride(0) if has_extra and x_layout.is_paged_bytes else 0
    topk = a.indices.shape[1]
    x_topk = a.extra_indices.shape[1] if has_extra else 0
    index_blocks = triton.cdiv(topk, BLOCK_K) + triton.cdiv(x_topk, BLOCK_K)
    head_blocks = triton.cdiv(H, BLOCK_H)
    splits = choose_splits(T, head_blocks, index_blocks, a.q.device, waves)
    per_split = triton.cdiv(index_blocks, splits)
    splits = triton.cdiv(index_blocks, per_split) if index_blocks else 1
    part_o = part_lse = out                     # unused placeholders when not splitting
    if splits > 1:
        part_o = torch.empty(T, H, splits, 512, dtype=torch.float32, device=a.q.device)
        part_lse = torch.empty(T, H, splits, dtype=torch.float32, device=a.q.device)
    qs, qs_ptr = scalar_arg(a.q_scale)
    ks, ks_ptr = scalar_arg(a.kv_scale)
    dummy = a.indices
    lens, x_idx, x_lens = a.topk_lens, a.extra_indices, a.extra_topk_lens
    sink = a.attn_sink if a.attn_sink is not None else lse
    sink_s = a.attn_sink.stride(0) if a.attn_sink is not None else 0
    cache = fp8_bytes(a.kv_cache, soft)
    _decode_kernel[(T * head_blocks, splits)](
        fp8_bytes(a.q, soft), H, cache, a.indices, *a.indices.stride(), _or(lens, dummy), _stride(lens), topk,
        a.block_size, page, fp8_bytes(a.extra_kv_cache, soft) if has_extra else cache, _or(x_idx, dummy),
        *(x_idx.stride() if has_extra else (0, 0)),
        _or(x_lens, dummy), _stride(x_lens), x_topk, a.extra_block_size or 1, x_page,
        sink, sink_s, out, lse, part_o, part_lse, a.softmax_scale, qs, ks, per_split,
        HAS_LENS=lens is not None, HAS_EXTRA=has_extra, HAS_X_LENS=x_lens is not None,
        HAS_SINK=a.attn_sink is not None, LAYOUT=layout.kind, INLINE=layout.inline, X_LAYOUT=x_layout.kind,
        X_INLINE=x_layout.inline, FNUZ=layout.fp8_flavour == "fnuz",
        SPLIT=splits > 1, Q_SCALE_PTR=qs_ptr, KV_SCALE_PTR=ks_ptr, BLOCK_H=BLOCK_H, BLOCK_K=BLOCK_K, FP8_SOFT=soft,
        num_warps=warps, num_stages=stages,
    )
    if splits > 1:
        _combine_kernel[(T, head_blocks)](
            part_o, part_lse, sink, sink_s, out, lse, H, splits,
            HAS_SINK=a.attn_sink is not None, BLOCK_H=BLOCK_H, num_warps=warps,
        )
    return out, lse if a.need_lse else None


def _or(t, placeholder):
    return t if t is not None else placeholder


def _stride(t) -> int:
    """Element stride of an optional 1-D tensor (0 for None)."""
    return t.stride(0) if t is not None else 0


def warmup_calls(dims, limits, machine) -> list[dict]:
    """Warm-up (``dsv4ops.warmup``; sparse_mla_prefill's too): T=1 splits the index list across
    programs (few programs), T=sms does not; SWA-only, SWA + C4 (the indexer's top-k) and SWA + C128
    (every compressed token) layers, per cache layout."""
    extras = ((0, limits.c4_block), (dims.index_topk, limits.c4_block),
              (-(-limits.max_context // 128), limits.c128_block))
    return [dict(T=T, H=dims.heads, topk=dims.window, layout=lay, block_size=limits.swa_block, extra_topk=xt,
                 extra_block_size=xb)
            for T in sorted({1, max(1, min(limits.max_tokens, machine.sms))}) for lay in limits.layouts
            for xt, xb in extras]
