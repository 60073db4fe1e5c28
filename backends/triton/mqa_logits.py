"""Triton op 11: one program per (block of query rows, chunk of keys), consecutive programs walking
the chunks of one row block (its queries stay in cache). A program loads the block's queries and
weights once, then steps over the key tiles of its chunk that some row's [ks, ke) reaches (a
pipelined loop), scoring each tile against every (row, head) with one tl.dot whose columns are the
heads, so the sum over heads stays within each key's row of the product. With ``clean`` the rest of
the chunk is filled with -inf. The fp8 flavour is the inputs' dtype (OCP ``float8_e4m3fn`` or FNUZ
``float8_e4m3fnuz``): the kernel is specialised on it. The software fp8 path (OCP only) decodes keys
and queries once per call (``e4m3_decode``; a workspace of 2 bytes per element of q and k) to fp16
holding value * 2**-8 (exact), which the kernel reads, and scales the logits by 2**16.

MXFP4 keys (uint8 [S, 64] with UE8M0 [S, 4]): each key tile is decoded to bf16 (``mxfp4_decode``)
and the queries once per program (``index_queries_bf16``: fp8 bytes through the path's conversion,
or MXFP4), bf16 x bf16 dots with fp32 accumulation (exact products)."""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from .common import e4m3_decode, fp8_bytes, index_queries_bf16, mxfp4_decode
from .tuning import Target


@triton.jit
def _fill_inf(out_ptr, t, live_t, S, begin, end, BLOCK_Q: tl.constexpr, BLOCK_S: tl.constexpr):
    """-inf into out[t, begin:end] (tile by tile)."""
    for s0 in tl.range(begin, end, BLOCK_S):
        s = s0 + tl.arange(0, BLOCK_S)
        tl.store(out_ptr + t[None, :] * S + s[:, None], tl.full((BLOCK_S, BLOCK_Q), float("-inf"), tl.float32),
                 mask=live_t[None, :] & (s < end)[:, None])


@triton.jit
def query_block(q_ptr, q_scale_ptr, w_ptr, t0, T, H, stride_w0, stride_w1, BLOCK_Q: tl.constexpr,
                H_PAD: tl.constexpr, FP8_SOFT: tl.constexpr, KEYS_MXFP4: tl.constexpr, Q_MXFP4: tl.constexpr):
    """Queries ``[BLOCK_Q * H_PAD, 128]`` (row-major (row, head); bf16 with MXFP4 keys, else as
    given) and fp32 weights ``[BLOCK_Q * H_PAD]`` of rows ``t0..``, 0 past ``T`` rows and ``H`` heads."""
    r = tl.arange(0, BLOCK_Q * H_PAD)
    row = t0 + r // H_PAD
    head = r % H_PAD
    live_r = (head < H) & (row < T)
    if KEYS_MXFP4:
        q = index_queries_bf16(q_ptr, q_scale_ptr, row * H + head, live_r, BLOCK_Q * H_PAD, Q_MXFP4, FP8_SOFT)
    else:
        q = tl.load(q_ptr + (row * H + head)[:, None] * 128 + tl.arange(0, 128)[None, :], mask=live_r[:, None],
                    other=0.0)
    w = tl.load(w_ptr + row * stride_w0 + head * stride_w1, mask=live_r, other=0.0)
    return q, w


@triton.jit
def tile_logits(k_ptr, scale_ptr, s, live_s, q, w, BLOCK_S: tl.constexpr, BLOCK_Q: tl.constexpr,
                H_PAD: tl.constexpr, FP8_SOFT: tl.constexpr, KEYS_MXFP4: tl.constexpr):
    """fp32 ``[BLOCK_S, BLOCK_Q]``: the logits of keys ``s`` (``[BLOCK_S]``, 0 where ``live_s`` is
    False) against a ``query_block``."""
    if KEYS_MXFP4:
        packed = tl.load(k_ptr + s.to(tl.int64)[:, None] * 64 + tl.arange(0, 64)[None, :],
                         mask=live_s[:, None], other=0)
        sf = tl.load(scale_ptr + s.to(tl.int64)[:, None] * 4 + tl.arange(0, 4)[None, :], mask=live_s[:, None],
                     other=127)
        scores = tl.dot(mxfp4_decode(packed, sf, BLOCK_S, 128).to(tl.bfloat16), tl.trans(q))
    else:
        keys = tl.load(k_ptr + s.to(tl.int64)[:, None] * 128 + tl.arange(0, 128)[None, :], mask=live_s[:, None],
                       other=0.0)
        scale = tl.load(scale_ptr + s, mask=live_s, other=0.0)
        scores = tl.dot(keys, tl.trans(q)) * scale[:, None]               # [BLOCK_S, rows x heads]
    weighted = tl.reshape(tl.maximum(scores, 0.0) * w[None, :], (BLOCK_S, BLOCK_Q, H_PAD))
    logits = tl.sum(weighted, axis=2)                                       # [BLOCK_S, BLOCK_Q]
    if FP8_SOFT and not KEYS_MXFP4:
        logits = logits * 65536.0
    return logits


@triton.jit(do_not_specialize=["T", "S"], do_not_specialize_on_alignment=["ks_ptr", "ke_ptr"])
def _mqa_logits_kernel(q_ptr, q_scale_ptr, k_ptr, scale_ptr, w_ptr, ks_ptr, ke_ptr, out_ptr, T, S, H,
                       stride_w0, stride_w1, stride_ks, stride_ke,
                       CLEAN: tl.constexpr, BLOCK_Q: tl.constexpr, H_PAD: tl.constexpr, BLOCK_S: tl.constexpr,
                       CHUNK: tl.constexpr, STAGES: tl.constexpr, FP8_SOFT: tl.constexpr,
                       KEYS_MXFP4: tl.constexpr, Q_MXFP4: tl.constexpr):
    pid = tl.program_id(0).to(tl.int64)                  # 1-D grid: no 65535 limit on either axis
    n_chunks = tl.cdiv(S, CHUNK)
    t0 = pid // n_chunks * BLOCK_Q
    t = t0 + tl.arange(0, BLOCK_Q)
    c0 = (pid % n_chunks).to(tl.int32) * CHUNK
    c1 = tl.minimum(c0 + CHUNK, S)
    live_t = t < T
    lo = tl.load(ks_ptr + t * stride_ks, mask=live_t, other=S)
    hi = tl.load(ke_ptr + t * stride_ke, mask=live_t, other=0)
    # tiles of [c0, c1) that some row's range reaches: [start, stop)
    start = c0 + tl.maximum(tl.min(lo, axis=0) - c0, 0) // BLOCK_S * BLOCK_S
    end = tl.minimum(tl.max(hi, axis=0), c1)
    stop = tl.where(end > start, start + tl.cdiv(end - start, BLOCK_S) * BLOCK_S, start)
    if CLEAN:                                            # the rest of [c0, c1), never past c1 (another program's)
        _fill_inf(out_ptr, t, live_t, S, c0, tl.minimum(start, c1), BLOCK_Q, BLOCK_S)
        _fill_inf(out_ptr, t, live_t, S, tl.minimum(stop, c1), c1, BLOCK_Q, BLOCK_S)
    if stop > start:
        q, w = query_block(q_ptr, q_scale_ptr, w_ptr, t0, T, H, stride_w0, stride_w1, BLOCK_Q, H_PAD, FP8_SOFT,
                           KEYS_MXFP4, Q_MXFP4)
        for s0 in tl.range(start, stop, BLOCK_S, num_stages=STAGES):
            s = s0 + tl.arange(0, BLOCK_S)
            live_s = s < c1
            logits = tile_logits(k_ptr, scale_ptr, s, live_s, q, w, BLOCK_S, BLOCK_Q, H_PAD, FP8_SOFT, KEYS_MXFP4)
            valid = (s[:, None] >= lo[None, :]) & (s[:, None] < hi[None, :])
            dst = out_ptr + t[None, :] * S + s[:, None]
            if CLEAN:
                tl.store(dst, tl.where(valid, logits, float("-inf")), mask=live_t[None, :] & live_s[:, None])
            else:
                tl.store(dst, logits, mask=valid & live_s[:, None])


def mqa_logits(target: Target, a):
    T, H, _ = a.q.shape
    S = a.k.shape[0]
    out = torch.empty(T, S, dtype=torch.float32, device=a.q.device) if a.out is None else a.out
    if T == 0 or S == 0:
        return out
    tune = target.tuning
    grid = (triton.cdiv(T, tune.mqa_block_q) * triton.cdiv(S, tune.mqa_chunk_s),)
    q, k, keys_mxfp4, q_mxfp4, h_pad = operands(target, a)
    _mqa_logits_kernel[grid](
        q, a.q_scale, k, a.k_scale, a.weights, a.ks, a.ke, out, T, S, H, a.weights.stride(0), a.weights.stride(1),
        a.ks.stride(0), a.ke.stride(0), CLEAN=a.clean, BLOCK_Q=tune.mqa_block_q, H_PAD=h_pad,
        BLOCK_S=tune.mqa_block_s, CHUNK=tune.mqa_chunk_s, STAGES=tune.mqa_stages, FP8_SOFT=target.fp8_soft,
        KEYS_MXFP4=keys_mxfp4, Q_MXFP4=q_mxfp4,
        num_warps=tune.mqa_warps,
    )
    return out


def operands(target: Target, a):
    """(q, k, KEYS_MXFP4, Q_MXFP4, H_PAD) as the kernels take them from an mqa_logits-shaped call:
    with MXFP4 keys q's bytes (fp8 q converted in the kernel), on the software fp8 path q and k
    decoded to fp16 once."""
    keys_mxfp4 = a.k.dtype == torch.uint8
    if keys_mxfp4:
        q, k = fp8_bytes(a.q, True), a.k
    else:
        q, k = (e4m3_decode(a.q), e4m3_decode(a.k[None])[0]) if target.fp8_soft else (a.q, a.k)
    return q, k, keys_mxfp4, a.q.dtype == torch.uint8, max(16, triton.next_power_of_2(a.q.shape[1]))


def warmup_calls(dims, limits, machine) -> list[dict]:
    """Warm-up (``dsv4ops.warmup``): the clean flag (T and S are not specialized)."""
    return [dict(T=4, S=256, H=dims.index_heads, clean=c) for c in (False, True)]
