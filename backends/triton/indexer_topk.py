"""Triton op 5: one program per row. A 4-pass, 8-bit radix select over order-preserving uint32
keys finds the k-th largest valid logit (only columns inside the row's range are counted), then
two passes write the row-local indices above the threshold and as many ties as fill k; -1 after."""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from dsv4ops.platform import platform

from .tuning import tuning


@triton.jit
def _sort_key(x):
    """fp32 -> uint32 whose unsigned order is the float order (-inf < ... < +inf)."""
    bits = x.to(tl.uint32, bitcast=True)
    return tl.where((bits >> 31) != 0, bits ^ 0xFFFFFFFF, bits | 0x80000000)


@triton.jit
def _row_range(row, starts_ptr, ends_ptr, lens_ptr, next_n, MODE: tl.constexpr):
    """MODE 0: [row_starts, row_ends); 1: 1-D decode lengths (causal MTP); 2: 2-D decode lengths."""
    if MODE == 0:
        start = tl.load(starts_ptr + row)
        end = tl.load(ends_ptr + row)
    elif MODE == 1:
        start = 0
        end = tl.maximum(tl.load(lens_ptr + row // next_n) - next_n + row % next_n + 1, 0)
    else:
        start = 0
        end = tl.load(lens_ptr + row)
    return start, tl.maximum(end, start)


@triton.jit
def _indexer_topk_kernel(logits_ptr, stride_r, stride_c, starts_ptr, ends_ptr, lens_ptr, next_n, out_ptr, k,
                         MODE: tl.constexpr, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    start, end = _row_range(row, starts_ptr, ends_ptr, lens_ptr, next_n, MODE)
    src = logits_ptr + row * stride_r
    want = tl.minimum(end - start, k)          # number of indices to write
    remaining = want
    prefix = tl.zeros((), tl.uint32)
    digits = tl.arange(0, 256)
    for p in range(4):                          # most significant byte first
        shift = 24 - 8 * p
        hist = tl.zeros((256,), tl.int32)
        for c0 in range(start, end, BLOCK):
            c = c0 + tl.arange(0, BLOCK)
            live = c < end
            key = _sort_key(tl.load(src + c * stride_c, mask=live, other=0.0))
            if p > 0:
                live = live & ((key >> (shift + 8)) == prefix)
            hist += tl.histogram(((key >> shift) & 0xFF).to(tl.int32), 256, mask=live)
        at_or_above = tl.sum(hist) - tl.cumsum(hist, axis=0) + hist
        chosen = tl.max(tl.where(at_or_above >= remaining, digits, 0), axis=0)
        remaining -= tl.sum(tl.where(digits > chosen, hist, 0), axis=0)
        prefix = (prefix << 8) | chosen.to(tl.uint32)
    # prefix is the k-th largest key; `remaining` ties with it are still to be taken.
    dst = out_ptr + row * k
    written = 0
    for c0 in range(start, end, BLOCK):
        c = c0 + tl.arange(0, BLOCK)
        live = c < end
        key = _sort_key(tl.load(src + c * stride_c, mask=live, other=0.0))
        above = live & (key > prefix) & (want > 0)
        pos = written + tl.cumsum(above.to(tl.int32), axis=0) - 1
        tl.store(dst + pos, (c - start).to(tl.int32), mask=above)
        written += tl.sum(above.to(tl.int32), axis=0)
    ties = 0
    for c0 in range(start, end, BLOCK):
        c = c0 + tl.arange(0, BLOCK)
        live = c < end
        key = _sort_key(tl.load(src + c * stride_c, mask=live, other=0.0))
        tie = live & (key == prefix)
        rank = ties + tl.cumsum(tie.to(tl.int32), axis=0) - 1
        take = tie & (rank < remaining)
        tl.store(dst + written + rank, (c - start).to(tl.int32), mask=take)
        ties += tl.sum(tie.to(tl.int32), axis=0)
    for c0 in range(0, k, BLOCK):
        c = c0 + tl.arange(0, BLOCK)
        tl.store(dst + c, tl.full((BLOCK,), -1, tl.int32), mask=(c >= want) & (c < k))


def indexer_topk(logits, k, *, row_starts=None, row_ends=None, seq_lens=None, next_n=1, out=None):
    R = logits.shape[0]
    out = torch.empty(R, k, dtype=torch.int32, device=logits.device) if out is None else out
    if R == 0:
        return out
    mode = 0 if seq_lens is None else (2 if seq_lens.dim() == 2 else 1)
    dummy = out
    tune = tuning(platform(logits.device))
    _indexer_topk_kernel[(R,)](
        logits, logits.stride(0), logits.stride(1),
        row_starts if row_starts is not None else dummy, row_ends if row_ends is not None else dummy,
        seq_lens if seq_lens is not None else dummy, next_n, out, k,
        MODE=mode, BLOCK=tune.topk_block, num_warps=tune.topk_warps,
    )
    return out
