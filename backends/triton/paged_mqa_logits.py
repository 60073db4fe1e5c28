"""Triton op 3: one program per (request, block of compressed tokens). It gathers the block's
fp8 keys once and scores them against each MTP row's heads with one tl.dot per row, keys as the
tall operand (``[BLOCK_T, 128] x [128, H]``): the weighted sum over heads then runs along the
product's columns, inside each warp, with no exchange through shared memory. Any next_n. weights,
context_lens and block_table are read through their strides. The software fp8 path decodes the
queries to fp16 holding value * 2**-8 (exact) once per call (``e4m3_decode``, 2 bytes per query
element), the keys likewise per program, and scales the logits by 2**16.

MXFP4 keys (68 B, ``index_mxfp4``): the program decodes its key tile to bf16 (``index_mxfp4_keys``:
e2m1 times a power of two, exact in bf16) and each row's queries likewise, from fp8 bytes
(``e4m3_byte_to_f32``, the path's conversion) or from MXFP4 with their UE8M0 bytes; the dots are
bf16 x bf16 with fp32 accumulation (exact products)."""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from dsv4ops.formats import INDEX_MXFP4_TOKEN_BYTES

from .common import e4m3_as_f16, e4m3_decode, fp8_bytes, index_mxfp4_keys, index_queries_bf16
from .tuning import Target


@triton.jit
def row_limits(lens_ptr, b, j, next_n, stride_l0, stride_l1, LENS_2D: tl.constexpr):
    """Valid columns of row(s) ``j`` (MTP indices, a scalar or a block) of request ``b``; 0 for padding rows."""
    live = j < next_n
    if LENS_2D:
        return tl.load(lens_ptr + b * stride_l0 + j * stride_l1, mask=live, other=0)
    return tl.where(live, tl.maximum(tl.load(lens_ptr + b * stride_l0) - next_n + j + 1, 0), 0)


@triton.jit
def key_tile(cache_ptr, table_ptr, b, t, live_t, block_size, page_stride, stride_t0, stride_t1,
             BLOCK_T: tl.constexpr, FP8_SOFT: tl.constexpr, KEYS_MXFP4: tl.constexpr):
    """Keys of request ``b`` at columns ``t`` (``[BLOCK_T]``, pages through the block table), as the
    dots take them: bf16 (MXFP4), fp16 holding value * 2**-8 (software fp8) or fp8 ``[BLOCK_T, 128]``;
    and their fp32 scales ``[BLOCK_T]`` (ones for MXFP4). Columns where ``live_t`` is False read as 0."""
    page = tl.load(table_ptr + b * stride_t0 + (t // block_size).to(tl.int64) * stride_t1, mask=live_t,
                   other=0).to(tl.int64)
    if KEYS_MXFP4:
        keys = index_mxfp4_keys(cache_ptr, page, t % block_size, live_t, block_size, page_stride,
                                BLOCK_T).to(tl.bfloat16)
        scale = tl.full((BLOCK_T,), 1.0, tl.float32)
    else:
        page_base = cache_ptr + page * page_stride
        keys = tl.load((page_base + (t % block_size) * 128)[:, None] + tl.arange(0, 128)[None, :],
                       mask=live_t[:, None], other=0)
        if FP8_SOFT:
            keys = e4m3_as_f16(keys)
        else:
            keys = keys.to(tl.float8e4nv, bitcast=True)
        scale = tl.load((page_base + block_size * 128 + (t % block_size) * 4).to(tl.pointer_type(tl.float32)),
                        mask=live_t, other=0.0)
    return keys, scale


@triton.jit
def tile_logits(keys, scale, q_ptr, q_scale_ptr, w_ptr, row, H, stride_w0, stride_w1, H_PAD: tl.constexpr,
                FP8_SOFT: tl.constexpr, KEYS_MXFP4: tl.constexpr, Q_MXFP4: tl.constexpr):
    """fp32 ``[BLOCK_T]``: sum_h w[row, h] * relu(q[row, h] . key * scale) of a ``key_tile``, for
    query row ``row`` (int64)."""
    h = tl.arange(0, H_PAD)
    if KEYS_MXFP4:
        q = index_queries_bf16(q_ptr, q_scale_ptr, row * H + h, h < H, H_PAD, Q_MXFP4, FP8_SOFT)
        s = tl.dot(keys, tl.trans(q))                                      # [BLOCK_T, H_PAD]
    else:
        q = tl.load(q_ptr + (row * H + h)[:, None] * 128 + tl.arange(0, 128)[None, :], mask=(h < H)[:, None],
                    other=0.0)
        s = tl.dot(keys, tl.trans(q)) * scale[:, None]
    w = tl.load(w_ptr + row * stride_w0 + h.to(tl.int64) * stride_w1, mask=h < H, other=0.0)
    logits = tl.sum(tl.maximum(s, 0.0) * w[None, :], axis=1)
    if FP8_SOFT and not KEYS_MXFP4:      # fp16 operands held each value * 2**-8
        logits = logits * 65536.0
    return logits


@triton.jit(do_not_specialize=["width", "stride_t0"], do_not_specialize_on_alignment=["lens_ptr", "table_ptr"])
def _paged_mqa_logits_kernel(q_ptr, q_scale_ptr, cache_ptr, w_ptr, lens_ptr, table_ptr, out_ptr, H, next_n,
                             block_size, page_stride, width,
                             stride_w0, stride_w1, stride_l0, stride_l1, stride_t0, stride_t1,
                             LENS_2D: tl.constexpr, CLEAN: tl.constexpr, NEXT_N_PAD: tl.constexpr,
                             H_PAD: tl.constexpr, BLOCK_T: tl.constexpr, FP8_SOFT: tl.constexpr,
                             KEYS_MXFP4: tl.constexpr, Q_MXFP4: tl.constexpr):
    b = tl.program_id(0).to(tl.int64)
    t0 = tl.program_id(1) * BLOCK_T
    t = t0 + tl.arange(0, BLOCK_T)
    row_max = tl.max(row_limits(lens_ptr, b, tl.arange(0, NEXT_N_PAD), next_n, stride_l0, stride_l1, LENS_2D),
                     axis=0)
    if t0 < row_max:
        keys, scale = key_tile(cache_ptr, table_ptr, b, t, t < row_max, block_size, page_stride, stride_t0,
                               stride_t1, BLOCK_T, FP8_SOFT, KEYS_MXFP4)
        for j in range(next_n):
            row = b * next_n + j
            logits = tile_logits(keys, scale, q_ptr, q_scale_ptr, w_ptr, row, H, stride_w0, stride_w1, H_PAD,
                                 FP8_SOFT, KEYS_MXFP4, Q_MXFP4)
            valid = t < row_limits(lens_ptr, b, j, next_n, stride_l0, stride_l1, LENS_2D)
            out_row = out_ptr + row * width + t
            if CLEAN:
                tl.store(out_row, tl.where(valid, logits, float("-inf")), mask=t < width)
            else:
                tl.store(out_row, logits, mask=(t < width) & valid)
    elif CLEAN:                                  # (names differ from the branch above: other shapes)
        all_j = tl.arange(0, NEXT_N_PAD)
        tail = out_ptr + (b * next_n + all_j)[:, None] * width + t[None, :]
        tl.store(tail, tl.full((NEXT_N_PAD, BLOCK_T), float("-inf"), tl.float32),
                 mask=(all_j < next_n)[:, None] & (t < width)[None, :])


def queries(target: Target, a):
    """(q as the kernels take it, KEYS_MXFP4, Q_MXFP4, H_PAD) of a paged_mqa_logits-shaped call: with
    MXFP4 keys the bytes (fp8 q converted per program), on the software fp8 path the fp16 decode."""
    H = a.q.shape[2]
    keys_mxfp4 = a.kv_cache.shape[-1] == INDEX_MXFP4_TOKEN_BYTES
    if keys_mxfp4:
        q = fp8_bytes(a.q, True)
    else:
        q = e4m3_decode(a.q.view(-1, H, 128)) if target.fp8_soft else a.q
    return q, keys_mxfp4, a.q.dtype == torch.uint8, max(16, triton.next_power_of_2(H))


def paged_mqa_logits(target: Target, a):
    B, next_n, H, _ = a.q.shape
    out = torch.empty(B * next_n, a.max_context_len, dtype=torch.float32, device=a.q.device) if a.out is None else a.out
    if B == 0 or a.max_context_len == 0:
        return out
    tune = target.tuning
    BLOCK_T = tune.logits_block_t
    lens = a.context_lens
    grid = (B, triton.cdiv(a.max_context_len, BLOCK_T))
    q, keys_mxfp4, q_mxfp4, h_pad = queries(target, a)
    _paged_mqa_logits_kernel[grid](
        q, a.q_scale, a.kv_cache, a.weights, lens, a.block_table, out, H, next_n,
        a.kv_cache.shape[1], a.kv_cache.stride(0), a.max_context_len,
        a.weights.stride(0), a.weights.stride(1), lens.stride(0), lens.stride(-1), a.block_table.stride(0),
        a.block_table.stride(1), LENS_2D=lens.dim() == 2, CLEAN=a.clean, NEXT_N_PAD=triton.next_power_of_2(next_n),
        H_PAD=h_pad, BLOCK_T=BLOCK_T, FP8_SOFT=target.fp8_soft, KEYS_MXFP4=keys_mxfp4, Q_MXFP4=q_mxfp4,
        num_warps=tune.logits_warps,
    )
    return out


def warmup_calls(dims, limits, machine) -> list[dict]:
    """Warm-up (``dsv4ops.warmup``): the lengths' form and the clean flag (widths and the table's
    pitch are not specialized)."""
    return [dict(B=1, next_n=limits.next_n, context=2 * limits.c4_block, H=dims.index_heads,
                 block_size=limits.c4_block, lens_dim=d, clean=c) for d in (1, 2) for c in (False, True)]
