"""Triton op 14: two kernels. The first scores blocks: one program per (row, tile of blocks) takes
the largest visible logit of each block (NaN kept apart: ``tl.max`` does not promise to propagate
it) and writes the block's int32 order key (docs/ops.md §14) to a workspace of ``ceil(W / block)``
keys per row rounded up to a multiple of 16 (1 / block of the logits' bytes). The second selects: one program per row finds the
``count``-th largest key bit by bit (32 counting passes over the row's keys, a radix select), then
walks the blocks in ascending order once, keeping those above the threshold and, of those equal to
it, the lowest-numbered ones the count still allows: the output is sorted without a sort."""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from .tuning import Target

TILE = 256                      # blocks per tile in both kernels


@triton.jit
def _row_range(starts_ptr, ends_ptr, lens_ptr, r, next_n, stride_s, stride_e, stride_l0, stride_l1,
               RANGED: tl.constexpr, LENS_2D: tl.constexpr):
    """[start, start + n) of row ``r``: the ranges form, or the decode form (causal rule for 1-D lengths)."""
    if RANGED:
        start = tl.load(starts_ptr + r * stride_s)
        n = tl.maximum(tl.load(ends_ptr + r * stride_e) - start, 0)
    else:
        start = 0
        b, j = r // next_n, r % next_n
        if LENS_2D:
            n = tl.load(lens_ptr + b * stride_l0 + j * stride_l1)
        else:
            n = tl.maximum(tl.load(lens_ptr + b * stride_l0) - next_n + j + 1, 0)
    return start, n


# The block count changes every step: the kernels take it rounded up to a multiple of 16 (the blocks
# past the row hold no visible position: dropped), so that Triton specializes it alike at every
# width (not specializing it cost 3.5-7% on the H100, docs/perf/README.md). The logits' row pitch
# stays specialized (a multiple of 16 or not: vector loads of a row), as indexer_topk's does.
@triton.jit(do_not_specialize_on_alignment=["starts_ptr", "ends_ptr", "lens_ptr"])
def _block_keys_kernel(logits_ptr, starts_ptr, ends_ptr, lens_ptr, keys_ptr, next_n, block, nb,
                       stride_r, stride_c, stride_s, stride_e, stride_l0, stride_l1,
                       RANGED: tl.constexpr, LENS_2D: tl.constexpr, BLOCK_PAD: tl.constexpr, TILE: tl.constexpr):
    r = tl.program_id(0).to(tl.int64)
    blk = tl.program_id(1) * TILE + tl.arange(0, TILE)
    start, n = _row_range(starts_ptr, ends_ptr, lens_ptr, r, next_n, stride_s, stride_e, stride_l0, stride_l1,
                          RANGED, LENS_2D)
    o = tl.arange(0, BLOCK_PAD)
    pos = blk[:, None] * block + o[None, :]
    visible = (o[None, :] < block) & (pos < n)
    x = tl.load(logits_ptr + r * stride_r + (start + pos).to(tl.int64) * stride_c, mask=visible,
                other=float("-inf"))
    nan = tl.max((x != x).to(tl.int32), axis=1) > 0
    score = tl.max(tl.where(x != x, float("-inf"), x), axis=1)
    bits = score.to(tl.int32, bitcast=True)
    key = bits ^ ((bits >> 31) & 0x7FFFFFFF)              # the float order as signed integers
    key = tl.where(score == 0.0, 0, key)                  # -0 reads as +0
    key = tl.where(score == float("-inf"), -2147483648, key)
    key = tl.where(nan, 2147483646, key)
    key = tl.where((blk == (n - 1) // block) & (n > 0), 2147483647, key)      # the newest position's block
    tl.store(keys_ptr + r * nb + blk, key, mask=blk < nb)


@triton.jit
def _count_at_least(keys_ptr, r, nb, threshold, TILE: tl.constexpr):
    """How many of row ``r``'s keys, read as unsigned (key + 2**31, int64), are >= ``threshold``."""
    total = 0
    for b0 in range(0, nb, TILE):
        blk = b0 + tl.arange(0, TILE)
        u = tl.load(keys_ptr + r * nb + blk, mask=blk < nb, other=-2147483648).to(tl.int64) + 2147483648
        total += tl.sum((u >= threshold).to(tl.int32), axis=0)
    return total


@triton.jit
def _select_kernel(keys_ptr, out_ptr, counts_ptr, nb, num_blocks, TILE: tl.constexpr):
    r = tl.program_id(0).to(tl.int64)
    count = tl.minimum(_count_at_least(keys_ptr, r, nb, 1, TILE), num_blocks)   # not dropped, capped
    threshold = tl.zeros((), tl.int64)                   # the count-th largest key, built from the top bit
    for bit in range(31, -1, -1):
        trial = threshold | (tl.full((), 1, tl.int64) << bit)
        threshold = tl.where(_count_at_least(keys_ptr, r, nb, trial, TILE) >= count, trial, threshold)
    ties = count - _count_at_least(keys_ptr, r, nb, threshold + 1, TILE)     # keys == threshold to keep
    kept = 0
    equal_seen = 0
    for b0 in range(0, nb, TILE):
        blk = b0 + tl.arange(0, TILE)
        u = tl.load(keys_ptr + r * nb + blk, mask=blk < nb, other=-2147483648).to(tl.int64) + 2147483648
        equal = (u == threshold) & (u > 0)
        rank = equal_seen + tl.cumsum(equal.to(tl.int32), axis=0)
        take = ((u > threshold) | (equal & (rank <= ties))) & (u > 0) & (count > 0)
        slot = kept + tl.cumsum(take.to(tl.int32), axis=0) - 1
        tl.store(out_ptr + r * num_blocks + slot, blk.to(tl.int32), mask=take)
        kept += tl.sum(take.to(tl.int32), axis=0)
        equal_seen += tl.sum(equal.to(tl.int32), axis=0)
    for s0 in range(kept, num_blocks, TILE):
        s = s0 + tl.arange(0, TILE)
        tl.store(out_ptr + r * num_blocks + s, tl.full((TILE,), -1, tl.int32), mask=s < num_blocks)
    tl.store(counts_ptr + r, kept)


def candidate_blocks(target: Target, a):
    R, W = a.logits.shape
    device = a.logits.device
    out = torch.empty(R, a.num_blocks, dtype=torch.int32, device=device)
    counts = torch.empty(R, dtype=torch.int32, device=device)
    if R == 0:
        return out, counts
    nb = triton.cdiv(max(triton.cdiv(W, a.sparse_block), 1), 16) * 16     # blocks, padded (dropped keys)
    keys = torch.empty(R, nb, dtype=torch.int32, device=device)
    ranged = a.seq_lens is None
    lens = a.row_starts if ranged else a.seq_lens
    starts, ends = (a.row_starts, a.row_ends) if ranged else (lens, lens)
    lens_2d = not ranged and lens.dim() == 2
    rows_per_seq = 1 if ranged else lens.shape[1] if lens_2d else a.next_n     # ranges: unused, one variant
    block_pad = triton.next_power_of_2(a.sparse_block)
    tile = max(1, min(TILE, 4096 // block_pad))
    _block_keys_kernel[(R, triton.cdiv(nb, tile))](
        a.logits, starts, ends, lens, keys, rows_per_seq, a.sparse_block, nb,
        a.logits.stride(0), a.logits.stride(1), starts.stride(0), ends.stride(0), lens.stride(0),
        lens.stride(-1), RANGED=ranged, LENS_2D=lens_2d, BLOCK_PAD=block_pad, TILE=tile)
    _select_kernel[(R,)](keys, out, counts, nb, a.num_blocks, TILE=TILE)
    return out, counts


def warmup_calls(dims, limits, machine) -> list[dict]:
    """Warm-up (``dsv4ops.warmup``): the row forms (``topk_modes``) and the logits' row pitch W: 1, a
    multiple of 16 or neither (Triton's classes); the widths and the block count are not specialized."""
    blocks = dict(sparse_block=dims.candidate_block, num_blocks=dims.candidate_blocks)
    return [dict(R=step, W=W, mode=mode, next_n=step, **blocks) for W in (1, 16, 17)
            for mode in limits.topk_modes for step in (1 if mode == "ranges" else limits.next_n,)]
