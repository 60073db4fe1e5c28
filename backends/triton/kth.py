"""Block-level selection primitives shared by the Triton top-k kernels (indexer_topk, the fused
indexers): order-preserving uint32 keys of fp32 values, the k-th largest key of a block held in
registers, the output slots of a selection, and -1 padding."""
from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def sort_key(x):
    """fp32 -> uint32 whose unsigned order is the float order (-inf < ... < +inf)."""
    bits = x.to(tl.uint32, bitcast=True)
    return tl.where((bits >> 31) != 0, bits ^ 0xFFFFFFFF, bits | 0x80000000)


@triton.jit
def _count_and_neighbours(a_count, a_up, a_down, b_count, b_up, b_down):
    return a_count + b_count, tl.minimum(a_up, b_up), tl.maximum(a_down, b_down)


@triton.jit
def kth_largest(key, k):
    """``(threshold, want)``: ``want`` = min(k, live keys) (``key`` >= 1; 0 marks a dead one), and
    the ``want``-th largest live key, or a key value with exactly ``want`` live keys at or above it
    (all ones when ``want`` is 0). ``kth_largest_within`` with no slack."""
    return kth_largest_within(key, k, 0)


@triton.jit
def kth_largest_within(key, k, slack):
    """As ``kth_largest``, but the search may end on a live key with up to ``want + slack`` live keys
    at or above it (an estimate's rank, fewer steps).

    A bracketed search: ``lo`` is a live key with at least ``want`` keys at or above it, ``top`` a
    key with fewer above it (``hi = top + 1`` bounds the answer). Each step counts the keys at or above
    a trial point (one block reduction) and moves one end onto it. The trial is interpolated from the
    two ends' counts (false position), then clamped so that the bracket at least halves against a
    budget that starts at 2^32: never more than 33 steps. When the same end has moved twice in a row
    (the interpolation stalls, as on runs of equal keys), the next step's reduction also returns the
    nearest live keys on either side of the trial point, so that end lands on a live key (and the
    other end's weight halves, Illinois-style): a bracket holding one key value then ends the search.
    About 5-15 steps on logit-like rows, bf16-rounded or with few distinct values included, against 32
    for a bit-by-bit bisection. It ends when ``lo`` has ``want`` to ``want + slack`` keys at or above
    it or the bracket holds one key value.

    The bracket is uint32 (the search's serial arithmetic between reductions, kept to 32 bits): live
    keys are at least 1, so its width ``top - lo + 1`` fits.
    """
    live = key > 0
    live_count, lo, top = tl.reduce((live.to(tl.int32), tl.where(live, key, 0xFFFFFFFF), key), 0,
                                    _count_and_neighbours)        # one reduction: count, min, max
    want = tl.minimum(live_count, k)
    over_lo = live_count - want                                               # count(>= lo) - want
    excess_lo = over_lo.to(tl.float32)           # the interpolation's weights: the ends' excess, halved when stalled
    excess_hi = -want.to(tl.float32)                                          # count(> top) - want
    budget = tl.full((), 0xFFFFFFFF, tl.uint32)  # the bracket's largest allowed width - 1, halved per step
    kept = 0                                     # end moved by the last step: 1 lo, -1 hi
    stalled = False                              # the last two steps moved the same end
    while (want > 0) & (top > lo) & (over_lo > slack):
        width = top - lo                         # trial = lo + offset, offset in [1, width]
        step = tl.minimum((width + 1).to(tl.float32) * (excess_lo / (excess_lo - excess_hi)), 4294967040.0)
        least = tl.maximum(width - tl.minimum(width, budget), 1)     # the bracket's far end within budget
        offset = tl.minimum(tl.maximum(step.to(tl.uint32), least), tl.minimum(width - 1, budget) + 1)
        trial = lo + offset
        at_or_above = key >= trial                          # trial >= 2: dead keys never count
        if stalled:                              # also the nearest live keys: no key in [trial, up) or (down, trial)
            count, up, down = tl.reduce((at_or_above.to(tl.int32), tl.where(at_or_above, key, 0xFFFFFFFF),
                                         tl.where(at_or_above, 0, key)), 0, _count_and_neighbours)
        else:
            count = tl.sum(at_or_above.to(tl.int32), axis=0)
            up = trial
            down = trial - 1
        excess = (count - want).to(tl.float32)
        if excess >= 0:                          # count(>= up) = count
            lo = up
            over_lo = count - want
            excess_lo = excess
            stalled = kept == 1
            excess_hi = tl.where(stalled, excess_hi * 0.5, excess_hi)
            kept = 1
        else:                                    # count(> down) = count
            top = down
            excess_hi = excess
            stalled = kept == -1
            excess_lo = tl.where(stalled, excess_lo * 0.5, excess_lo)
            kept = -1
        budget = budget >> 1
    return tl.where(want > 0, lo, 0xFFFFFFFF).to(tl.uint32), want


@triton.jit
def selection_slots(key, threshold, want):
    """``(slot, chosen)`` for a block of keys (at most 32768) and ``kth_largest``'s result: the keys
    above ``threshold`` take slots ``0..`` in block order, then as many keys equal to it as fill
    ``want``; the others are not chosen."""
    above = key > threshold
    tie = key == threshold
    # One scan for both slot sequences: above in the low 16 bits, ties in the high (block <= 32768).
    both = above.to(tl.int32) + (tie.to(tl.int32) << 16)
    written = tl.sum(both, axis=0) & 0xFFFF
    slots = tl.cumsum(both, axis=0) - both          # exclusive: (ties before) << 16 | (above before)
    rank = slots >> 16
    return tl.where(above, slots & 0xFFFF, written + rank), above | (tie & (rank < want - written))


@triton.jit
def live_key(key, live):
    """``key`` (``sort_key``) at least 1 where ``live`` and 0 (dead) elsewhere: keys 0 and 1 are both -NaN."""
    return tl.where(live, tl.maximum(key, 1), 0)


@triton.jit
def pad(dst, want, k, BLOCK: tl.constexpr):
    """-1 in ``dst[want:k]``."""
    for c0 in range(0, k, BLOCK):
        c = c0 + tl.arange(0, BLOCK)
        tl.store(dst + c, tl.full((BLOCK,), -1, tl.int32), mask=(c >= want) & (c < k))


def resident_warps(block: int, keys_per_thread: int, lanes: int) -> int:
    """Warps of a program holding ``block`` keys in registers: about ``keys_per_thread`` keys per
    thread, at least 4 warps, at most 1024 threads (16 warps of 64 lanes on CDNA GPUs)."""
    return min(max(block // (lanes * keys_per_thread), 4), 1024 // lanes)
