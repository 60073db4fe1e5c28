"""Triton compress_kv_insert (docs/ops.md §9):

1. ``_save_state``: each live token's fp32 state row ``[kv, score + ape[p % ratio]]`` (a copy; V4.1's
   ratio 2 has no ape), the rows of ``max(1, compress_save_elems // width)`` tokens per program.
   Ratio 1 keeps no state: step 2 reads each token's own kv row.
2. The window pooling: each program takes a block of tokens and handles the windows they close one
   after another. A window's state rows stream in chunks of ``compress_chunk`` positions with an
   online softmax per channel, then ``_write_entry`` does RMSNorm, RoPE (split / interleave of the
   pairs), bf16 and the quantized store, which need the whole row. The softmax is per channel, so
   the channels split freely: with ``compress_channels_c4`` (also ratio 2) / ``_c128`` >= D one ``_compress``
   program (of ``compress_tokens`` tokens per 512 channels, at most the ratio) pools and writes
   whole windows; below D (C128's default: the 64 windows of an 8192-token prefill would occupy
   half the SMs, walking 128 x 512 values each) ``_pool`` programs over (``compress_pool_tokens``
   tokens, channel group) write the pooled fp32 rows to a workspace [T', D], and ``_finish``
   programs of as many tokens write the entries.
The state copy, whole-window and entry programs run ``compress_warps`` warps per 512 channels: a
128-channel row (indexer keys) on one warp keeps its reductions and RoPE shuffles inside the warp.
Each launch reads what the one before wrote.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from dsv4ops import formats
from dsv4ops.quant import FP8_MAX

from .common import ceil_log2, exp2_int, mxfp4_encode, mxfp8_encode, nvfp4_encode, to_e4m3, v41_record_offsets
from .tuning import Target


@triton.jit(do_not_specialize=["n"])
def _save_state(kv_ptr, kv_stride, score_ptr, score_stride, pos_ptr, pos_stride, ape_ptr, state_ptr, st_stride0,
                st_stride1, sslot_ptr, sslot_stride, n, sbs, RATIO: tl.constexpr, WIDTH: tl.constexpr,
                TOKENS: tl.constexpr, HAS_APE: tl.constexpr):
    t = tl.program_id(0).to(tl.int64) * TOKENS + tl.arange(0, TOKENS)
    slot = tl.load(sslot_ptr + t * sslot_stride, mask=t < n, other=-1)
    live = (slot >= 0)[:, None]
    slot = tl.maximum(slot, 0)
    d = tl.arange(0, WIDTH)[None, :]
    row = (state_ptr + (slot // sbs) * st_stride0 + (slot % sbs) * st_stride1)[:, None] + d
    kv = tl.load(kv_ptr + t[:, None] * kv_stride + d, mask=live).to(tl.float32)
    score = tl.load(score_ptr + t[:, None] * score_stride + d, mask=live).to(tl.float32)
    if HAS_APE:
        phase = tl.load(pos_ptr + t * pos_stride, mask=t < n, other=0) % RATIO
        score += tl.load(ape_ptr + phase[:, None] * WIDTH + d, mask=live)
    tl.store(row, kv, mask=live)
    tl.store(row + WIDTH, score, mask=live)


@triton.jit
def _closing(n, pos_ptr, pos_stride, sslot_ptr, sslot_stride, slot_ptr, slot_stride, RATIO: tl.constexpr,
             TOKENS: tl.constexpr):
    """The program's TOKENS tokens: (token, position, compressed slot, rank among those that write an
    entry (from 1; 0 for the others), how many write one). Ratio 1 has no state slots: every token
    with a slot writes one."""
    t = tl.program_id(0).to(tl.int64) * TOKENS + tl.arange(0, TOKENS)
    tc = tl.minimum(t, n - 1)
    p = tl.load(pos_ptr + tc * pos_stride)
    slot = tl.load(slot_ptr + tc * slot_stride)
    closes = (t < n) & ((p + 1) % RATIO == 0) & (slot >= 0)
    if RATIO > 1:
        closes = closes & (tl.load(sslot_ptr + tc * sslot_stride) >= 0)
    rank = tl.where(closes, tl.cumsum(closes.to(tl.int32), axis=0), 0)
    return t, p, slot, rank, tl.sum(closes.to(tl.int32), axis=0)


@triton.jit
def _pick(i, t, p, slot, rank):
    """(token, position, compressed slot) of the i-th (from 0) token that writes an entry."""
    pick = rank == i + 1
    return (tl.sum(tl.where(pick, t, 0), axis=0), tl.sum(tl.where(pick, p, 0), axis=0),
            tl.sum(tl.where(pick, slot, 0), axis=0))


@triton.jit
def _pool_window(t, p, state_ptr, st_stride0, st_stride1, btab_ptr, btab_stride0, btab_stride1, req_ptr, req_stride,
                 sbs, c0, D: tl.constexpr, BD: tl.constexpr, RATIO: tl.constexpr, C: tl.constexpr,
                 CHUNK: tl.constexpr):
    """Channels [c0, c0 + BD) of the softmax-pooled window that position p closes, fp32 [BD]."""
    table = btab_ptr + tl.load(req_ptr + t * req_stride).to(tl.int64) * btab_stride0
    d = c0 + tl.arange(0, BD)
    m = tl.full((BD,), float("-inf"), tl.float32)
    den = tl.zeros((BD,), tl.float32)
    acc = tl.zeros((BD,), tl.float32)
    for j0 in tl.static_range(0, C * RATIO, CHUNK):
        j = j0 + tl.arange(0, CHUNK)
        w = p - C * RATIO + 1 + j
        ok = w >= 0
        wc = tl.maximum(w, 0)
        page = tl.load(table + (wc // sbs) * btab_stride1, mask=ok, other=0).to(tl.int64)
        first = (j >= RATIO).to(tl.int64) * D              # C4: the earlier RATIO positions use [0, D)
        row = state_ptr + page * st_stride0 + (wc % sbs) * st_stride1 + first
        ptr = row[:, None] + d[None, :]
        s = tl.load(ptr + C * D, mask=ok[:, None], other=float("-inf"))
        v = tl.load(ptr, mask=ok[:, None], other=0.0)
        m_new = tl.maximum(m, tl.max(s, axis=0))
        base = tl.where(m_new == float("-inf"), 0.0, m_new)
        e = tl.exp(s - base[None, :])
        alpha = tl.exp(m - base)
        den = den * alpha + tl.sum(e, axis=0)
        acc = acc * alpha + tl.sum(e * v, axis=0)
        m = m_new
    return acc / den


@triton.jit
def _write_entry(pooled, t, p, slot, w_ptr, w_stride, eps, cs_ptr, cache_ptr, lat_ptr, lat_stride, block_size,
                 page_bytes, D: tl.constexpr, RATIO: tl.constexpr, KIND: tl.constexpr, INLINE: tl.constexpr,
                 FP8_MAX: tl.constexpr, FP8_SOFT: tl.constexpr, LATENT: tl.constexpr):
    """RMSNorm, RoPE at the window's first position, bf16, and the quantized entry at ``slot``
    (V4.1 ratios 2 and 1: the normed latent rounded to bf16 before the rotation); with LATENT the
    un-rotated bf16 latent into row ``t`` of the latent buffer."""
    d = tl.arange(0, D)
    weight = tl.load(w_ptr + d * w_stride).to(tl.float32)
    normed = pooled / tl.sqrt(tl.sum(pooled * pooled, axis=0) / D + eps) * weight
    if RATIO <= 2:
        normed = normed.to(tl.bfloat16).to(tl.float32)
    if LATENT:
        tl.store(lat_ptr + t * lat_stride + d, normed.to(tl.bfloat16))
    even, odd = tl.split(tl.reshape(normed, (D // 2, 2)))
    i = tl.arange(0, D // 2) - (D - 64) // 2                 # rotation pair index, < 0 on NoPE dims
    rope = i >= 0
    cpos = (p - RATIO + 1) * 64
    cos = tl.load(cs_ptr + cpos + i, mask=rope, other=1.0)
    sin = tl.load(cs_ptr + cpos + 32 + i, mask=rope, other=0.0)
    e2 = tl.where(rope, even * cos - odd * sin, even)
    o2 = tl.where(rope, even * sin + odd * cos, odd)
    y = tl.interleave(e2, o2).to(tl.bfloat16).to(tl.float32)
    block = slot // block_size
    off = slot % block_size
    page_ptr = cache_ptr + block * page_bytes
    if KIND == 4 or KIND == 5:     # Layout.MXFP8 / Layout.NVFP4: one V4.1 record
        DATA: tl.constexpr = 256 if KIND == 5 else 512
        SCALES: tl.constexpr = 32 if KIND == 5 else 16
        if KIND == 5:
            values, scales = nvfp4_encode(tl.reshape(y, (1, D)), 1, FP8_SOFT)
        else:
            values, scales = mxfp8_encode(tl.reshape(y, (1, D)), 1, FP8_SOFT)
        data, sc = v41_record_offsets(off, block_size, DATA + SCALES, DATA, INLINE)
        tl.store(page_ptr + data + tl.arange(0, DATA)[None, :], values)
        tl.store(page_ptr + sc + tl.arange(0, SCALES)[None, :], scales)
    elif KIND == 6:                # Layout.INDEX_MXFP4: 64 value bytes, then 4 UE8M0 bytes
        values, scales = mxfp4_encode(tl.reshape(y, (1, D)), 1, D)
        tl.store(page_ptr + off * (D // 2) + tl.arange(0, D // 2)[None, :], values)
        tl.store(page_ptr + block_size * (D // 2) + off * (D // 32) + tl.arange(0, D // 32)[None, :], scales)
    elif KIND == 0:                # Layout.DS_MLA
        tiles = tl.reshape(y, (D // 64, 64))
        ex = ceil_log2(tl.maximum(tl.max(tl.abs(tiles), axis=1), 1e-4) / FP8_MAX)
        q8 = tl.reshape(to_e4m3(tiles * exp2_int(-ex)[:, None], FP8_MAX, False, FP8_SOFT), (D,))
        data = page_ptr + off * 576
        tl.store(data + d, q8.to(tl.uint8, bitcast=True), mask=d < D - 64)
        tl.store((data + D - 64).to(tl.pointer_type(tl.bfloat16)) + d - (D - 64), y.to(tl.bfloat16),
                 mask=d >= D - 64)
        k = tl.arange(0, D // 64)
        byte = tl.where(k < D // 64 - 1, tl.minimum(tl.maximum(ex + 127, 0), 255), 0)
        tl.store(page_ptr + block_size * 576 + off * 8 + k, byte.to(tl.uint8))
    else:                          # Layout.INDEX_FP8
        ex = ceil_log2(tl.maximum(tl.max(tl.abs(y), axis=0), 1e-4) / FP8_MAX)
        q8 = to_e4m3(y * exp2_int(-ex), FP8_MAX, False, FP8_SOFT)
        tl.store(page_ptr + off * D + d, q8.to(tl.uint8, bitcast=True))
        tl.store((page_ptr + block_size * D + off * 4).to(tl.pointer_type(tl.float32)), exp2_int(ex))


@triton.jit(do_not_specialize=["n", "btab_stride0"])
def _compress(kv_ptr, kv_stride, pos_ptr, pos_stride, state_ptr, st_stride0, st_stride1, sslot_ptr, sslot_stride,
              btab_ptr, btab_stride0, btab_stride1, req_ptr, req_stride, sbs, w_ptr, w_stride, eps, cs_ptr, cache_ptr,
              lat_ptr, lat_stride, slot_ptr, slot_stride, block_size, page_bytes, n, D: tl.constexpr,
              RATIO: tl.constexpr, C: tl.constexpr, CHUNK: tl.constexpr, KIND: tl.constexpr, INLINE: tl.constexpr,
              FP8_MAX: tl.constexpr, TOKENS: tl.constexpr, FP8_SOFT: tl.constexpr, LATENT: tl.constexpr):
    """Program of TOKENS tokens: pools each whole window they close and writes its entry (one token:
    a branch, not a loop, which takes sm90 16 registers fewer)."""
    t, p, slot, rank, count = _closing(n, pos_ptr, pos_stride, sslot_ptr, sslot_stride, slot_ptr, slot_stride, RATIO,
                                       TOKENS)
    window = (t, p, slot, rank, kv_ptr, kv_stride, state_ptr, st_stride0, st_stride1, btab_ptr, btab_stride0,
              btab_stride1, req_ptr, req_stride, sbs, w_ptr, w_stride, eps, cs_ptr, cache_ptr, lat_ptr, lat_stride,
              block_size, page_bytes)
    if TOKENS == 1:
        if count > 0:
            _whole_window(0, *window, D, RATIO, C, CHUNK, KIND, INLINE, FP8_MAX, FP8_SOFT, LATENT)
    else:
        for i in range(count):
            _whole_window(i, *window, D, RATIO, C, CHUNK, KIND, INLINE, FP8_MAX, FP8_SOFT, LATENT)


@triton.jit
def _whole_window(i, t, p, slot, rank, kv_ptr, kv_stride, state_ptr, st_stride0, st_stride1, btab_ptr, btab_stride0,
                  btab_stride1, req_ptr, req_stride, sbs, w_ptr, w_stride, eps, cs_ptr, cache_ptr, lat_ptr, lat_stride,
                  block_size, page_bytes, D: tl.constexpr, RATIO: tl.constexpr, C: tl.constexpr, CHUNK: tl.constexpr,
                  KIND: tl.constexpr, INLINE: tl.constexpr, FP8_MAX: tl.constexpr, FP8_SOFT: tl.constexpr,
                  LATENT: tl.constexpr):
    """The entry of the window the i-th closing token of the block closes (ratio 1: the token's own
    kv row, no state)."""
    ti, pi, si = _pick(i, t, p, slot, rank)
    if RATIO == 1:
        pooled = tl.load(kv_ptr + ti * kv_stride + tl.arange(0, D)).to(tl.float32)
    else:
        pooled = _pool_window(ti, pi, state_ptr, st_stride0, st_stride1, btab_ptr, btab_stride0, btab_stride1,
                              req_ptr, req_stride, sbs, 0, D, D, RATIO, C, CHUNK)
    _write_entry(pooled, ti, pi, si, w_ptr, w_stride, eps, cs_ptr, cache_ptr, lat_ptr, lat_stride, block_size,
                 page_bytes, D, RATIO, KIND, INLINE, FP8_MAX, FP8_SOFT, LATENT)


@triton.jit(do_not_specialize=["n", "btab_stride0"])
def _pool(pos_ptr, pos_stride, state_ptr, st_stride0, st_stride1, sslot_ptr, sslot_stride, btab_ptr, btab_stride0,
          btab_stride1, req_ptr, req_stride, sbs, slot_ptr, slot_stride, ws_ptr, n, D: tl.constexpr, BD: tl.constexpr,
          RATIO: tl.constexpr, C: tl.constexpr, CHUNK: tl.constexpr, TOKENS: tl.constexpr):
    """Program (TOKENS tokens, channel group g): channels [g*BD, (g+1)*BD) of the pooled row of each
    window the tokens close, into ws [T', D] fp32. Windows close at most every RATIO-th token of a
    request, so a block holds few (a per-token grid would be mostly programs that return at once)."""
    t, p, slot, rank, count = _closing(n, pos_ptr, pos_stride, sslot_ptr, sslot_stride, slot_ptr, slot_stride, RATIO,
                                       TOKENS)
    c0 = tl.program_id(1) * BD
    for i in range(count):
        ti, pi, _ = _pick(i, t, p, slot, rank)
        pooled = _pool_window(ti, pi, state_ptr, st_stride0, st_stride1, btab_ptr, btab_stride0, btab_stride1, req_ptr,
                              req_stride, sbs, c0, D, BD, RATIO, C, CHUNK)
        tl.store(ws_ptr + ti * D + c0 + tl.arange(0, BD), pooled)


@triton.jit(do_not_specialize=["n"])
def _finish(pos_ptr, pos_stride, sslot_ptr, sslot_stride, slot_ptr, slot_stride, ws_ptr, w_ptr, w_stride, eps, cs_ptr,
            cache_ptr, lat_ptr, lat_stride, block_size, page_bytes, n, D: tl.constexpr, RATIO: tl.constexpr,
            KIND: tl.constexpr, INLINE: tl.constexpr, FP8_MAX: tl.constexpr, TOKENS: tl.constexpr,
            FP8_SOFT: tl.constexpr, LATENT: tl.constexpr):
    """Program of TOKENS tokens: the entries of the pooled rows ``_pool`` left in ws."""
    t, p, slot, rank, count = _closing(n, pos_ptr, pos_stride, sslot_ptr, sslot_stride, slot_ptr, slot_stride, RATIO,
                                       TOKENS)
    for i in range(count):
        ti, pi, si = _pick(i, t, p, slot, rank)
        pooled = tl.load(ws_ptr + ti * D + tl.arange(0, D))
        _write_entry(pooled, ti, pi, si, w_ptr, w_stride, eps, cs_ptr, cache_ptr, lat_ptr, lat_stride, block_size,
                     page_bytes, D, RATIO, KIND, INLINE, FP8_MAX, FP8_SOFT, LATENT)


def compress_kv_insert(target: Target, a):
    slots = a.slot_mapping
    n = slots.shape[0]
    if n == 0:
        return None
    c = formats.window_overlap(a.ratio)
    width = a.kv.shape[1]
    D = width // c
    page_bytes = a.kv_cache.stride(0)
    tun = target.tuning
    warps = max(1, tun.compress_warps * D // 512)        # per 512 channels: a 128-channel row on one warp
    pos = a.positions
    if a.ratio == 1:
        # no state: the kernels read each token's kv row and never load these (placeholders)
        sc, sc_strides, sslots, table, req = a.kv, (0, 0), slots, slots.view(1, n), slots
        channels = D
    else:
        sc, sslots, table, req = a.state_cache, a.state_slot_mapping, a.state_block_table, a.token_to_req
        sc_strides = (sc.stride(0), sc.stride(1))
        channels = min(D, tun.compress_channels_c128 if a.ratio == 128 else tun.compress_channels_c4)
        tokens = max(1, tun.compress_save_elems // width)
        ape = sc if a.ape is None else a.ape
        _save_state[(triton.cdiv(n, tokens),)](a.kv, a.kv.stride(0), a.score, a.score.stride(0), pos, pos.stride(0),
                                               ape, sc, *sc_strides, sslots, sslots.stride(0), n, sc.shape[1],
                                               RATIO=a.ratio, WIDTH=width, TOKENS=tokens, HAS_APE=a.ape is not None,
                                               num_warps=warps)
    chunk = min(c * a.ratio, tun.compress_chunk)
    window = (pos, pos.stride(0), sc, *sc_strides, sslots, sslots.stride(0), table, table.stride(0),
              table.stride(1), req, req.stride(0), sc.shape[1])
    lat = (a.kv, 0) if a.latent is None else (a.latent, a.latent.stride(0))     # a.kv: never written
    entry = (a.norm_weight, a.norm_weight.stride(0), a.eps, a.cos_sin_cache, a.kv_cache, *lat)
    if channels == D:
        per = min(a.ratio, max(1, tun.compress_tokens * 512 // D))      # ratio 4, 128 channels: a window each
        _compress[(triton.cdiv(n, per),)](a.kv, a.kv.stride(0), *window, *entry, slots, slots.stride(0), a.block_size,
                                          page_bytes, n, D=D, RATIO=a.ratio, C=c, CHUNK=chunk, KIND=a.layout.kind,
                                          INLINE=a.layout.inline, FP8_MAX=FP8_MAX["ocp"], TOKENS=per,
                                          FP8_SOFT=target.fp8_soft, LATENT=a.latent is not None, num_warps=warps)
        return None
    ws = torch.empty(n, D, dtype=torch.float32, device=a.kv.device)
    per = tun.compress_pool_tokens
    _pool[(triton.cdiv(n, per), D // channels)](*window, slots, slots.stride(0), ws, n, D=D, BD=channels, RATIO=a.ratio,
                                                C=c, CHUNK=chunk, TOKENS=per, num_warps=tun.compress_pool_warps)
    _finish[(triton.cdiv(n, per),)](pos, pos.stride(0), sslots, sslots.stride(0), slots, slots.stride(0), ws, *entry,
                                    a.block_size, page_bytes, n, D=D, RATIO=a.ratio, KIND=a.layout.kind,
                                    INLINE=a.layout.inline, FP8_MAX=FP8_MAX["ocp"], TOKENS=per, FP8_SOFT=target.fp8_soft,
                                    LATENT=a.latent is not None, num_warps=warps)
    return None


def warmup_calls(dims, limits, machine) -> list[dict]:
    """Warm-up (``dsv4ops.warmup``): the C4 and C128 attention caches of each layout that has them,
    and the indexer's C4 cache (tokens and the state table's pitch are not specialized)."""
    kinds = [(lay, 4, limits.c4_block) for lay in limits.layouts if lay == "fp8_ds_mla"]
    kinds += [(lay, 128, limits.c128_block) for lay in limits.layouts if lay == "fp8_ds_mla"]
    kinds.append(("index_fp8", 4, limits.c4_block))
    return [dict(layout=lay, ratio=r, block_size=bs, reqs=((0, r),)) for lay, r, bs in kinds]
