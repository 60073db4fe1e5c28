"""Triton op 5: per-row top-k by radix select over order-preserving uint32 keys.

A program selects the k largest of a set of positions and writes them (ties as many as fill k, in
column order), then -1 up to k. Two ways to find the k-th largest key, chosen at compile time:

- resident (the set fits one block, ``topk_resident`` columns): the keys are loaded once and stay
  in registers. When the set is larger than ``topk_cap`` (and 2k fit that), a sample of
  ``topk_sample`` keys at a regular stride (loaded again, from cache) gives a floor, one compare
  counts the keys at or above it, and when they number at least k and at most the cap they are
  compacted into per-program scratch slots (global memory, read back after a block barrier), where
  32 bisection steps over the key bits, each a block reduction (no atomics), find the k-th largest
  among at most ``topk_cap`` keys. Every key at or above the answer is among them, so the steps
  decide as they would on all keys. Otherwise (equal logits, heavy ties, an unlucky sample) the
  32 steps run over every key. Either way the keys above the answer are written at their cumsum
  positions, then the ties in column order.
- streamed (larger sets, block by block): the same sampled floor, one pass stashing the keys at or
  above it and the bisection of those; otherwise (or when gathering, whose live count would take a
  pass) 4 passes of an 8-bit histogram. Then a pass writes the keys above the answer and one the ties.

A row is split into pieces, one program each, when it is longer than ``topk_max_piece`` or when
there are fewer rows than multiprocessors (then as many pieces as one wave holds); each piece keeps
its k largest columns (stage 1: the row's top-k is inside the union of the pieces' top-k), and a
second program per row selects from those candidates (stage 2), gathering their logits, the same
two ways. Output columns are row-local (``column - row_start``).
"""
from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl

from dsv4ops.backend_support import topk_output
from dsv4ops.platform import multiprocessors, platform

from .tuning import tuning


@triton.jit
def _sort_key(x):
    """fp32 -> uint32 whose unsigned order is the float order (-inf < ... < +inf)."""
    bits = x.to(tl.uint32, bitcast=True)
    return tl.where((bits >> 31) != 0, bits ^ 0xFFFFFFFF, bits | 0x80000000)


@triton.jit
def _row_range(row, starts_ptr, ends_ptr, lens_ptr, stride_0, stride_1, next_n, MODE: tl.constexpr):
    """MODE 0: [row_starts, row_ends); 1: 1-D decode lengths (causal MTP rule); 2: 2-D decode lengths
    ``[B, next_n]``. Strides: of row_starts and row_ends in MODE 0, of seq_lens' two dims otherwise."""
    if MODE == 0:
        start = tl.load(starts_ptr + row * stride_0)
        end = tl.load(ends_ptr + row * stride_1)
    elif MODE == 1:
        start = 0
        end = tl.maximum(tl.load(lens_ptr + (row // next_n) * stride_0) - next_n + row % next_n + 1, 0)
    else:
        start = 0
        end = tl.load(lens_ptr + (row // next_n) * stride_0 + (row % next_n) * stride_1)
    return start, tl.maximum(end, start)


@triton.jit
def _candidates(src, stride_c, cand_row, p, lo, hi, GATHER: tl.constexpr):
    """Columns and keys at positions ``p``: the positions themselves (valid in [lo, hi)), or, when
    gathering, the candidate columns stored at ``cand_row[p]`` (valid when >= 0)."""
    if GATHER:
        col = tl.load(cand_row + p, mask=p < hi, other=-1)
        live = col >= 0
    else:
        col = p
        live = (p >= lo) & (p < hi)
    key = _sort_key(tl.load(src + col.to(tl.int64) * stride_c, mask=live, other=0.0))
    return col, live, key


@triton.jit
def _next_digit(hist, remaining, BINS: tl.constexpr):
    """One radix step of the streamed selection: the largest digit whose keys, with those of every
    larger digit, number at least ``remaining`` (all counted in ``hist``); and how many of the wanted
    keys are still to be found among the keys with that digit."""
    digits = tl.arange(0, BINS)
    at_or_above = tl.sum(hist, axis=0) - tl.cumsum(hist, axis=0) + hist
    chosen = tl.max(tl.where(at_or_above >= remaining, digits, 0), axis=0)
    return chosen, remaining - tl.sum(tl.where(digits > chosen, hist, 0), axis=0)


@triton.jit
def _kth_largest(key, want, BITS: tl.constexpr = 32):
    """The ``want``-th largest of ``key`` (all ones when ``want`` is 0), bit by bit from the top: keep
    a bit when at least ``want`` keys are >= the candidate with it set. Dead positions hold key 0,
    which no candidate (>= 1) counts, so the loop holds the keys alone (no mask in registers).
    ``BITS`` < 32 stops early: the answer with its low ``32 - BITS`` bits cleared."""
    threshold = tl.zeros((), tl.uint32)
    for bit in tl.static_range(BITS):
        trial = threshold | (tl.full((), 1, tl.uint32) << (31 - bit))
        count = tl.sum(tl.where(key >= trial, 1, 0), axis=0)
        threshold = tl.where(count >= want, trial, threshold)
    return threshold


@triton.jit
def _candidate_floor(src, stride_c, cand_row, lo, hi, n_live, want, GATHER: tl.constexpr, SAMPLE: tl.constexpr,
                     SAMPLE_BITS: tl.constexpr, CAP: tl.constexpr):
    """A key ``floor`` such that, with high probability, between ``want`` and ``CAP`` live keys are >=
    it: a key of a sample (``SAMPLE`` positions at a regular stride over [lo, hi), loaded again) whose
    sample rank, scaled to the whole set, is the middle of that range (its top ``SAMPLE_BITS`` bits:
    a lower floor, found in fewer steps); 1 (every live key but the lowest, which no bisection trial
    counts) when the ``n_live`` live keys fit ``CAP``. Never 0, so that dead positions (key 0) stay out."""
    stride = tl.maximum(tl.cdiv(hi - lo, SAMPLE), 1)
    _, live, key = _candidates(src, stride_c, cand_row, lo + tl.arange(0, SAMPLE) * stride, lo, hi, GATHER)
    sampled = tl.sum(live.to(tl.int32), axis=0)
    rank = tl.minimum(tl.cdiv(sampled * (want + CAP), 2 * tl.maximum(n_live, 1)), sampled)
    floor = _kth_largest(tl.where(live, key, 0), rank, SAMPLE_BITS)
    return tl.where(n_live <= CAP, 1, tl.maximum(floor, 1))


@triton.jit
def _stash(key, chosen, offset, scratch, CAP: tl.constexpr):
    """Write the keys where ``chosen`` to this program's ``CAP`` int32 scratch slots, packed from
    ``offset`` (those that fit); returns how many were chosen."""
    pos = offset + tl.cumsum(chosen.to(tl.int32), axis=0) - 1
    tl.store(scratch + pos, key.to(tl.int32, bitcast=True), mask=chosen & (pos < CAP))
    return tl.sum(chosen.to(tl.int32), axis=0)


@triton.jit
def _stashed(scratch, n, CAP: tl.constexpr):
    """The ``n`` (<= CAP) stashed keys as a ``[CAP]`` block, key 0 (which no bisection trial counts)
    after them."""
    tl.debug_barrier()                           # the block reads back what its threads wrote
    slot = tl.arange(0, CAP)
    return tl.load(scratch + slot, mask=slot < n, other=0).to(tl.uint32, bitcast=True)


@triton.jit
def _threshold(key, n_live, want, src, stride_c, cand_row, lo, hi, scratch, GATHER: tl.constexpr,
               SAMPLED: tl.constexpr, SAMPLE: tl.constexpr, SAMPLE_BITS: tl.constexpr, CAP: tl.constexpr):
    """The ``want``-th largest of the live keys (``key`` 0 where dead; all ones when ``want`` is 0).
    SAMPLED: bisect the at most CAP keys >= a sampled floor when at least ``want`` of them are (every
    key >= the answer then is one, so the bisection takes the same steps); else bisect all keys."""
    if SAMPLED:
        floor = _candidate_floor(src, stride_c, cand_row, lo, hi, n_live, want, GATHER, SAMPLE, SAMPLE_BITS, CAP)
        n_chosen = _stash(key, key >= floor, 0, scratch, CAP)
        if (n_chosen >= want) & (n_chosen <= CAP):
            threshold = _kth_largest(_stashed(scratch, n_chosen, CAP), want)
        else:                                    # ties, equal keys, an unlucky sample
            threshold = _kth_largest(key, want)
    else:
        threshold = _kth_largest(key, want)
    return threshold


@triton.jit
def _radix_select(src, stride_c, cand_row, lo, hi, k, GATHER: tl.constexpr, BLOCK: tl.constexpr):
    """Streamed: (the want-th largest key, how many keys equal to it are to be taken, want = the
    live positions in [lo, hi), at most k), in 4 passes of an 8-bit histogram, block by block."""
    prefix = tl.zeros((), tl.uint32)
    remaining = 0
    want = 0
    for p in range(4):                           # most significant byte first
        shift = 24 - 8 * p
        hist = tl.zeros((256,), tl.int32)
        for c0 in range(lo, hi, BLOCK):
            col, live, key = _candidates(src, stride_c, cand_row, c0 + tl.arange(0, BLOCK), lo, hi, GATHER)
            if p > 0:
                live = live & ((key >> (shift + 8)) == prefix)
            hist += tl.histogram(((key >> shift) & 0xFF).to(tl.int32), 256, mask=live)
        if p == 0:
            want = tl.minimum(tl.sum(hist, axis=0), k)     # valid positions, at most k
            remaining = want
        chosen, remaining = _next_digit(hist, remaining, 256)
        prefix = (prefix << 8) | chosen.to(tl.uint32)
    return prefix, remaining, want


@triton.jit
def _sampled_select(src, stride_c, cand_row, lo, hi, k, scratch, GATHER: tl.constexpr, BLOCK: tl.constexpr,
                    SAMPLE: tl.constexpr, SAMPLE_BITS: tl.constexpr, CAP: tl.constexpr):
    """``_radix_select`` of positions that are all live (not gathering) through a sampled floor: one
    pass stashes the keys >= it; when they number at least ``want`` and at most CAP, the bisection
    of those gives the answer, else the histogram passes run."""
    n_live = tl.maximum(hi - lo, 0).to(tl.int32)
    want = tl.minimum(n_live, k)
    floor = _candidate_floor(src, stride_c, cand_row, lo, hi, n_live, want, GATHER, SAMPLE, SAMPLE_BITS, CAP)
    n_chosen = 0
    for c0 in range(lo, hi, BLOCK):
        _, live, key = _candidates(src, stride_c, cand_row, c0 + tl.arange(0, BLOCK), lo, hi, GATHER)
        n_chosen += _stash(key, live & (key >= floor), n_chosen, scratch, CAP)
    if (n_chosen >= want) & (n_chosen <= CAP):
        stashed = _stashed(scratch, n_chosen, CAP)
        prefix = _kth_largest(stashed, want)
        remaining = want - tl.sum((stashed > prefix).to(tl.int32), axis=0)
    else:                                        # ties, equal keys, an unlucky sample
        prefix, remaining, want = _radix_select(src, stride_c, cand_row, lo, hi, k, GATHER, BLOCK)
    return prefix, remaining, want


@triton.jit
def _indexer_topk_kernel(logits_ptr, stride_r, stride_c, starts_ptr, ends_ptr, lens_ptr, stride_0, stride_1,
                         next_n, cand_ptr,
                         n_cand, out_ptr, out_stride, k, chunk, scratch_ptr,
                         MODE: tl.constexpr, GATHER: tl.constexpr, LOCAL: tl.constexpr, BLOCK: tl.constexpr,
                         RESIDENT: tl.constexpr, SAMPLED: tl.constexpr, SAMPLE: tl.constexpr,
                         SAMPLE_BITS: tl.constexpr, CAP: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    part = tl.program_id(1)
    start, end = _row_range(row, starts_ptr, ends_ptr, lens_ptr, stride_0, stride_1, next_n, MODE)
    src = logits_ptr + row * stride_r
    cand_row = cand_ptr + row * n_cand
    if GATHER:
        lo = 0
        hi = n_cand
    else:
        lo = start + part * chunk
        hi = tl.minimum(end, lo + chunk)
    base = start if LOCAL else 0                 # written column = column - base
    dst = out_ptr + row * out_stride + part * k
    scratch = scratch_ptr + (row * tl.num_programs(1) + part) * CAP

    if RESIDENT:                                 # hi - lo <= BLOCK: one load, selection in registers
        col, live, key = _candidates(src, stride_c, cand_row, lo + tl.arange(0, BLOCK), lo, hi, GATHER)
        n_live = tl.sum(live.to(tl.int32), axis=0)
        want = tl.minimum(n_live, k)
        key = tl.where(live, key, 0)
        threshold = _threshold(key, n_live, want, src, stride_c, cand_row, lo, hi, scratch, GATHER, SAMPLED,
                               SAMPLE, SAMPLE_BITS, CAP)
        above = live & (key > threshold)
        written = tl.sum(above.to(tl.int32), axis=0)
        tl.store(dst + tl.cumsum(above.to(tl.int32), axis=0) - 1, (col - base).to(tl.int32), mask=above)
        tie = live & (key == threshold)
        rank = tl.cumsum(tie.to(tl.int32), axis=0) - 1
        tl.store(dst + written + rank, (col - base).to(tl.int32), mask=tie & (rank < want - written))
    else:
        if SAMPLED:
            prefix, remaining, want = _sampled_select(src, stride_c, cand_row, lo, hi, k, scratch, GATHER, BLOCK,
                                                      SAMPLE, SAMPLE_BITS, CAP)
        else:
            prefix, remaining, want = _radix_select(src, stride_c, cand_row, lo, hi, k, GATHER, BLOCK)
        # prefix is the want-th largest key; `remaining` ties with it are still to be taken.
        written = 0
        for c0 in range(lo, hi, BLOCK):
            col, live, key = _candidates(src, stride_c, cand_row, c0 + tl.arange(0, BLOCK), lo, hi, GATHER)
            above = live & (key > prefix) & (want > 0)
            pos = written + tl.cumsum(above.to(tl.int32), axis=0) - 1
            tl.store(dst + pos, (col - base).to(tl.int32), mask=above)
            written += tl.sum(above.to(tl.int32), axis=0)
        ties = 0
        for c0 in range(lo, hi, BLOCK):
            col, live, key = _candidates(src, stride_c, cand_row, c0 + tl.arange(0, BLOCK), lo, hi, GATHER)
            tie = live & (key == prefix) & (want > 0)
            rank = ties + tl.cumsum(tie.to(tl.int32), axis=0) - 1
            tl.store(dst + written + rank, (col - base).to(tl.int32), mask=tie & (rank < remaining))
            ties += tl.sum(tie.to(tl.int32), axis=0)
    for c0 in range(0, k, BLOCK):
        c = c0 + tl.arange(0, BLOCK)
        tl.store(dst + c, tl.full((BLOCK,), -1, tl.int32), mask=(c >= want) & (c < k))


def indexer_topk(a):
    R, W = a.logits.shape
    out = topk_output(a)
    if R == 0:
        return out
    plat = platform(a.logits.device)
    tune = tuning(plat)
    if a.seq_lens is None:
        mode, starts, ends, lens, next_n = 0, a.row_starts, a.row_ends, out, 1
        strides = (a.row_starts.stride(0), a.row_ends.stride(0))
    else:
        two_d = a.seq_lens.dim() == 2
        mode, starts, ends, lens = (2 if two_d else 1), out, out, a.seq_lens
        next_n = a.seq_lens.shape[1] if two_d else a.next_n
        strides = (a.seq_lens.stride(0), a.seq_lens.stride(1) if two_d else 0)
    rows = (a.logits, a.logits.stride(0), a.logits.stride(1), starts, ends, lens, *strides, next_n)
    pieces, piece = _split(R, W, a.k, tune, multiprocessors(a.logits.device))
    launch = functools.partial(_launch, rows, mode, tune, a.k, plat.vendor == "cuda")
    if pieces == 1:                              # one program per row
        launch((R, 1), out, 0, out, a.k, W, W, gather=False, local=True)
        return out
    n_cand = pieces * a.k                        # stage 1: each piece's k largest columns
    cand = torch.empty(R, n_cand, dtype=torch.int32, device=a.logits.device)
    launch((R, pieces), cand, 0, cand, n_cand, piece, piece, gather=False, local=False)
    launch((R, 1), cand, n_cand, out, a.k, W, n_cand, gather=True, local=True)
    return out


def _split(R: int, W: int, k: int, tune, sms: int) -> tuple[int, int]:
    """(pieces per row, columns per piece): enough pieces that none is longer than ``topk_max_piece``
    and, when rows are fewer than the multiprocessors, as many as one wave of programs holds (a
    resident program of ``topk_resident`` columns fills a multiprocessor), none shorter than
    ``topk_min_piece`` or 2k."""
    pieces = triton.cdiv(W, tune.topk_max_piece)
    if R < sms:
        pieces = max(pieces, min(sms // R, W // max(tune.topk_min_piece, 2 * k)))
    if pieces <= 1:
        return 1, W
    return pieces, max(triton.cdiv(W, pieces), k)


def _launch(rows, mode, tune, k, cuda, grid, cand, n_cand, out, out_stride, chunk, span, *, gather, local):
    """One launch whose programs each select among ``span`` positions: resident when they fit; through
    ``topk_sample`` sampled keys and at most ``topk_cap`` stashed ones when those are fewer than the
    positions and hold 2k (streamed: when not gathering, which would need a pass to count them)."""
    resident = span <= tune.topk_resident
    block = triton.next_power_of_2(max(span, 16)) if resident else tune.topk_block
    warps = min(max(block // (32 * tune.topk_keys_per_thread), 4), 32) if resident else tune.topk_warps
    sampled = 2 * k <= tune.topk_cap < span and (resident or not gather)
    scratch = _scratch(grid[0] * grid[1] * tune.topk_cap if sampled else 0, out.device)
    # CUDA: the register file for one program (ptxas otherwise caps some 16-warp selections at 64
    # registers, spilling 4x more: sm90 offline). The AMD backend has no such option.
    options = dict(maxnreg=min(65536 // (32 * warps), 255)) if cuda else {}
    _indexer_topk_kernel[grid](*rows, cand, n_cand, out, out_stride, k, chunk, scratch, MODE=mode, GATHER=gather,
                               LOCAL=local, BLOCK=block, RESIDENT=resident, SAMPLED=sampled,
                               SAMPLE=min(tune.topk_sample, triton.next_power_of_2(span)),
                               SAMPLE_BITS=tune.topk_sample_bits, CAP=tune.topk_cap, num_warps=warps, **options)


def _scratch(n: int, device) -> torch.Tensor:
    """int32 [n]: ``topk_cap`` slots per program of a sampled selection (never read before written)."""
    return torch.empty(max(n, 1), dtype=torch.int32, device=device)
