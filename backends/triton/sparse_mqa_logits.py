"""Triton ops 15 and 16 (one kernel): the logits of each row's candidate blocks. One program per
(row, tile of compressed columns): it maps its columns to positions through the row's blocks,
gathers those keys (a paged cache, 132 B fp8 or 68 B MXFP4 keys, or contiguous fp8 keys from the
row's range start) and scores them against the row's heads with one tl.dot, keys as the tall
operand, the weighted sum over heads along the product's columns (as in paged_mqa_logits). Columns
of -1 blocks or invisible positions read no key. The software fp8 path decodes the queries once per
call (``e4m3_decode``) and the gathered key bytes in the kernel (``e4m3_as_f16``), fp16 operands
holding value * 2**-8, and scales the logits by 2**16. MXFP4 keys are decoded to bf16 (e2m1 values
times UE8M0 powers of two are exact there) and dotted with the bf16 queries (exact fp8 values)."""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from .common import e4m3_as_f16, e4m3_decode, index_mxfp4_keys
from .tuning import Target


@triton.jit
def _fp8_operand(values, FP8_SOFT: tl.constexpr):
    """e4m3 bytes as the dot takes them: the fp8 type, or fp16 holding value * 2**-8."""
    if FP8_SOFT:
        y = e4m3_as_f16(values)
    else:
        y = values.to(tl.float8e4nv, bitcast=True)
    return y


@triton.jit
def _keys(cache_ptr, scale_ptr, table_ptr, req, start, pos, live, block_size, stride_t0, stride_t1,
          PAGED: tl.constexpr, MXFP4: tl.constexpr, FP8_SOFT: tl.constexpr, BLOCK_T: tl.constexpr):
    """(keys [BLOCK_T, 128] as the dot takes them, per-key scale [BLOCK_T]) of row-local positions
    ``pos``: from page ``block_table[req, pos // block_size]`` of the cache (MXFP4 keys: bf16 values,
    scale 1), or key ``start + pos`` of the contiguous buffer; rows where ``live`` is False read 0."""
    d = tl.arange(0, 128)
    if PAGED:
        page = tl.load(table_ptr + req * stride_t0 + (pos // block_size).to(tl.int64) * stride_t1, mask=live,
                       other=0).to(tl.int64)
        slot = (pos % block_size).to(tl.int64)
        if MXFP4:
            keys = index_mxfp4_keys(cache_ptr, page, slot, live, block_size, block_size * 68, BLOCK_T).to(tl.bfloat16)
            scale = tl.full((BLOCK_T,), 1.0, tl.float32)
        else:
            base = cache_ptr + page * (block_size * 132)
            keys = _fp8_operand(tl.load((base + slot * 128)[:, None] + d[None, :], mask=live[:, None], other=0),
                                FP8_SOFT)
            scale = tl.load((base + block_size * 128 + slot * 4).to(tl.pointer_type(tl.float32)), mask=live,
                            other=0.0)
    else:
        key = (start + pos).to(tl.int64)
        keys = _fp8_operand(tl.load(cache_ptr + key[:, None] * 128 + d[None, :], mask=live[:, None], other=0),
                            FP8_SOFT)
        scale = tl.load(scale_ptr + key, mask=live, other=0.0)
    return keys, scale


@triton.jit(do_not_specialize=["stride_t0"], do_not_specialize_on_alignment=["lens_ptr", "ke_ptr", "table_ptr"])
def _sparse_mqa_logits_kernel(q_ptr, cache_ptr, scale_ptr, w_ptr, lens_ptr, ke_ptr, table_ptr, blocks_ptr, out_ptr,
                              H, next_n, block_size, sparse_block, width,
                              stride_w0, stride_w1, stride_l0, stride_l1, stride_ke, stride_t0, stride_t1,
                              stride_b0, stride_b1,
                              PAGED: tl.constexpr, MXFP4: tl.constexpr, LENS_2D: tl.constexpr, CLEAN: tl.constexpr,
                              H_PAD: tl.constexpr, BLOCK_T: tl.constexpr, FP8_SOFT: tl.constexpr):
    r = tl.program_id(0).to(tl.int64)
    c = tl.program_id(1) * BLOCK_T + tl.arange(0, BLOCK_T)
    in_row = c < width
    req = r // next_n
    if PAGED:                       # decode rows: [0, n) of the request's pages
        start = 0
        j = r % next_n
        if LENS_2D:
            n = tl.load(lens_ptr + req * stride_l0 + j * stride_l1)
        else:
            n = tl.maximum(tl.load(lens_ptr + req * stride_l0) - next_n + j + 1, 0)
    else:                           # prefill rows: [ks, ke) of the key buffer (lens_ptr is ks)
        start = tl.load(lens_ptr + r * stride_l0)
        n = tl.load(ke_ptr + r * stride_ke) - start
    block = tl.load(blocks_ptr + r * stride_b0 + (c // sparse_block).to(tl.int64) * stride_b1, mask=in_row, other=-1)
    pos = block * sparse_block + c % sparse_block
    live = in_row & (block >= 0) & (pos < n)
    keys, scale = _keys(cache_ptr, scale_ptr, table_ptr, req, start, pos, live, block_size, stride_t0, stride_t1,
                        PAGED, MXFP4, FP8_SOFT, BLOCK_T)
    h = tl.arange(0, H_PAD)
    q = tl.load(q_ptr + (r * H + h)[:, None] * 128 + tl.arange(0, 128)[None, :], mask=(h < H)[:, None], other=0.0)
    if MXFP4 and PAGED:
        if FP8_SOFT:
            q = (q.to(tl.float32) * 256.0).to(tl.bfloat16)
        else:
            q = q.to(tl.bfloat16)
    s = tl.dot(keys, tl.trans(q)) * scale[:, None]                              # [BLOCK_T, H_PAD]
    w = tl.load(w_ptr + r * stride_w0 + h.to(tl.int64) * stride_w1, mask=h < H, other=0.0)
    logits = tl.sum(tl.maximum(s, 0.0) * w[None, :], axis=1)
    if FP8_SOFT and not (MXFP4 and PAGED):       # both fp16 operands held each value * 2**-8
        logits = logits * 65536.0
    dst = out_ptr + r * width + c
    if CLEAN:
        tl.store(dst, tl.where(live, logits, float("-inf")), mask=in_row)
    else:
        tl.store(dst, logits, mask=live)


def launch(target: Target, a, q, cache, scale, lens, ke, table, paged: bool, mxfp4: bool):
    """Both forms: ``q`` [R, H, 128] fp8, the key source (``cache`` + ``table``, or ``cache`` = keys
    and ``scale`` = k_scale), the row lengths (``lens``: context_lens, or ks with ``ke``)."""
    R, H = q.shape[:2]
    width = a.blocks.shape[1] * a.sparse_block
    out = torch.empty(R, width, dtype=torch.float32, device=q.device) if a.out is None else a.out
    if R == 0 or width == 0:
        return out
    tune = target.tuning
    next_n = a.q.shape[1] if paged else 1
    q = e4m3_decode(q) if target.fp8_soft else q
    grid = (R, triton.cdiv(width, tune.logits_block_t))
    _sparse_mqa_logits_kernel[grid](
        q, cache.view(torch.uint8), scale, a.weights, lens, ke, table, a.blocks, out, H, next_n,
        cache.shape[1] if paged else 1, a.sparse_block, width, a.weights.stride(0), a.weights.stride(1),
        lens.stride(0), lens.stride(-1), ke.stride(0), table.stride(0), table.stride(-1), a.blocks.stride(0),
        a.blocks.stride(1), PAGED=paged, MXFP4=mxfp4, LENS_2D=paged and lens.dim() == 2, CLEAN=a.clean,
        H_PAD=max(16, triton.next_power_of_2(H)), BLOCK_T=tune.logits_block_t, FP8_SOFT=target.fp8_soft,
        num_warps=tune.logits_warps,
    )
    return out


def sparse_mqa_logits(target: Target, a):
    return launch(target, a, a.q, a.k, a.k_scale, a.ks, a.ke, a.ks, paged=False, mxfp4=False)


def warmup_calls(dims, limits, machine) -> list[dict]:
    """Warm-up (``dsv4ops.warmup``): the clean flag at the model's V4.1 index heads and candidate
    blocks (T, S and the table's pitch are not specialized)."""
    blocks = dict(sparse_block=dims.candidate_block, num_blocks=dims.candidate_blocks)
    return [dict(T=4, S=4 * dims.candidate_block, H=dims.v41_index_heads, clean=c, **blocks) for c in (False, True)]
