"""Triton op 5: per-row top-k over order-preserving uint32 keys (``kth.py``).

Rows of at least ``topk_threshold_min`` columns take the threshold path (``threshold_topk.py``): a
threshold read off a sample, one filtering pass appending the keys above it to bounded candidate
slots, one collect program per row, and an exact fallback for a row the sample misjudged.

Narrower rows: a program selects the k largest of a set of positions and writes them (ties as many
as fill k, in column order), then -1 up to k. Two ways to find the k-th largest key, chosen at
compile time:

- resident (the set fits one block, ``topk_resident`` columns): the keys are loaded once and stay
  in registers; an interpolated, bracketed search over the key values, each step a block reduction
  (no atomics), finds it (``kth_largest``).
- streamed (larger sets): 4 passes of an 8-bit histogram over the positions, block by block.

A row is split into pieces, one program each, when it is longer than a resident block or when
there are too few rows to fill the GPU; each piece keeps its k largest columns (stage 1: the row's
top-k is inside the union of the pieces' top-k), and a second program per row selects from those
candidates (stage 2), gathering their logits. Output columns are row-local (``column - row_start``).
"""
from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl

from dsv4ops.backend_support import topk_output
from dsv4ops.platform import multiprocessors

from . import threshold_topk
from .common import let_dependents_launch, pdl_launch, wait_for_prior_grid
from .kth import kth_largest, live_key, pad, resident_warps, selection_slots, sort_key
from .threshold_topk import (append_at_least, collect, collected, count_pointer, filter_columns, load_tau, sample_columns,
                             sample_threshold, store_state)
from .tuning import Target, tuning, warp_lanes


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
def _load_end(end, width):
    """The column a row ending at ``end`` is loaded below: ``end`` rounded up to 16, at most ``width``
    (``load_bound``), so that masks ending there are constant over 16-column groups."""
    return tl.minimum((end + 15) // 16 * 16, width)


@triton.jit
def _piece(start, end, part, chunk, width):
    """Piece ``part`` of a row's columns [start, end), pieces of ``chunk`` columns counted from
    ``start`` rounded down to 16: ``(first, lo, hi, load_end)``. The piece reads columns ``first + i``
    (``i < chunk``) below ``load_end`` (``_load_end``, within the piece) and keeps those in [lo, hi).
    Where ``chunk`` and ``width`` are multiples of 16 (Triton specializes that), ``first`` and
    ``load_end`` are too, so each load's mask is constant over groups of 16 columns and Triton issues
    16-byte vector loads; a mask ending at ``end`` itself compiles to one 4-byte load per key."""
    first = start // 16 * 16 + part * chunk
    load_end = tl.minimum(first + chunk, _load_end(end, width))
    return first, tl.maximum(start, first), tl.minimum(end, first + chunk), load_end


@triton.jit
def _candidates(src, stride_c, cand_row, p, lo, hi, load_end, GATHER: tl.constexpr):
    """Columns, liveness and keys at positions ``p``: the positions themselves (live in [lo, hi),
    loaded below ``load_end``: ``_piece``), or, when gathering, the candidate columns stored at
    ``cand_row[p]`` (live when >= 0). The key of a dead position is unspecified."""
    if GATHER:
        col = tl.load(cand_row + p, mask=p < hi, other=-1)
        live = col >= 0
        x = tl.load(src + col.to(tl.int64) * stride_c, mask=live, other=0.0)
    else:
        col = p
        live = (p >= lo) & (p < hi)
        x = tl.load(src + col.to(tl.int64) * stride_c, mask=p < load_end, other=0.0)
    return col, live, sort_key(x)


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
def _select_resident(src, stride_c, cand_row, first, lo, hi, load_end, k, base, dst, GATHER: tl.constexpr,
                     BLOCK: tl.constexpr):
    """Writes the k largest of the positions [lo, hi) (inside [first, first + BLOCK)) to ``dst`` as
    ``column - base``, ties as many as fill k; the keys stay in registers. Returns how many it wrote."""
    col, live, key = _candidates(src, stride_c, cand_row, first + tl.arange(0, BLOCK), lo, hi, load_end, GATHER)
    key = live_key(key, live)
    threshold, want = kth_largest(key, k)
    slot, chosen = selection_slots(key, threshold, want)
    tl.store(dst + slot, (col - base).to(tl.int32), mask=chosen)
    return want


@triton.jit
def _select_streamed(src, stride_c, cand_row, first, lo, hi, load_end, k, base, dst, GATHER: tl.constexpr,
                     BLOCK: tl.constexpr):
    """As ``_select_resident`` for any number of positions (blocks from ``first``): 4 passes of an
    8-bit histogram find the k-th largest key, then one pass writes the keys above it, one the ties."""
    prefix = tl.zeros((), tl.uint32)
    remaining = 0
    want = 0
    for p in range(4):                           # most significant byte first
        shift = 24 - 8 * p
        hist = tl.zeros((256,), tl.int32)
        for c0 in range(first, hi, BLOCK):
            col, live, key = _candidates(src, stride_c, cand_row, c0 + tl.arange(0, BLOCK), lo, hi, load_end, GATHER)
            if p > 0:
                live = live & ((key >> (shift + 8)) == prefix)
            hist += tl.histogram(((key >> shift) & 0xFF).to(tl.int32), 256, mask=live)
        if p == 0:
            want = tl.minimum(tl.sum(hist, axis=0), k)     # valid positions, at most k
            remaining = want
        chosen, remaining = _next_digit(hist, remaining, 256)
        prefix = (prefix << 8) | chosen.to(tl.uint32)
    # prefix is the want-th largest key; `remaining` ties with it are still to be taken.
    written = 0
    for c0 in range(first, hi, BLOCK):
        col, live, key = _candidates(src, stride_c, cand_row, c0 + tl.arange(0, BLOCK), lo, hi, load_end, GATHER)
        above = live & (key > prefix) & (want > 0)
        pos = written + tl.cumsum(above.to(tl.int32), axis=0) - 1
        tl.store(dst + pos, (col - base).to(tl.int32), mask=above)
        written += tl.sum(above.to(tl.int32), axis=0)
    ties = 0
    for c0 in range(first, hi, BLOCK):
        col, live, key = _candidates(src, stride_c, cand_row, c0 + tl.arange(0, BLOCK), lo, hi, load_end, GATHER)
        tie = live & (key == prefix) & (want > 0)
        rank = ties + tl.cumsum(tie.to(tl.int32), axis=0) - 1
        tl.store(dst + written + rank, (col - base).to(tl.int32), mask=tie & (rank < remaining))
        ties += tl.sum(tie.to(tl.int32), axis=0)
    return want


# The row bounds are scalar loads: their addresses' alignment is not specialized. The integers are:
# Triton's divisibility-by-16 of the row pitch (``stride_r``) and of the load bound (``_piece``) lets
# a program load its row in 16-byte vectors (docs/perf/README.md); the piece length and the candidate
# pitch are multiples of 16 by construction (``_split``, ``_round16``), and the load bound takes the
# row pitch's class (``load_bound``), so only the row pitch adds a variant (``pitch_class``).
@triton.jit(do_not_specialize=["n_cand"], do_not_specialize_on_alignment=["starts_ptr", "ends_ptr", "lens_ptr"])
def _indexer_topk_kernel(logits_ptr, stride_r, stride_c, starts_ptr, ends_ptr, lens_ptr, stride_0, stride_1,
                         next_n, cand_ptr, cand_stride,
                         n_cand, out_ptr, out_stride, k, chunk, width,
                         MODE: tl.constexpr, GATHER: tl.constexpr, LOCAL: tl.constexpr, BLOCK: tl.constexpr,
                         RESIDENT: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    part = tl.program_id(1)
    start, end = _row_range(row, starts_ptr, ends_ptr, lens_ptr, stride_0, stride_1, next_n, MODE)
    src = logits_ptr + row * stride_r
    cand_row = cand_ptr + row * cand_stride
    if GATHER:
        first, lo, hi, load_end = 0, 0, n_cand, n_cand
    else:
        first, lo, hi, load_end = _piece(start, end, part, chunk, width)
    base = start if LOCAL else 0                 # written column = column - base
    dst = out_ptr + row * out_stride + part * k
    if RESIDENT:                                 # hi - first <= BLOCK: one load, selection in registers
        want = _select_resident(src, stride_c, cand_row, first, lo, hi, load_end, k, base, dst, GATHER, BLOCK)
    else:
        want = _select_streamed(src, stride_c, cand_row, first, lo, hi, load_end, k, base, dst, GATHER, BLOCK)
    pad(dst, want, k, BLOCK)


# The threshold path (threshold_topk.py): sample, filter, collect. Row pitch as above; the filter's
# piece length is a multiple of 16 by construction. With PDL the filter is launched while the
# threshold kernel runs and loads its first block of keys (an input nothing before writes) before it
# waits for it; the collect is launched while the filter runs and waits before anything else.
@triton.jit(do_not_specialize_on_alignment=["starts_ptr", "ends_ptr", "lens_ptr"])
def _threshold_kernel(logits_ptr, stride_r, stride_c, starts_ptr, ends_ptr, lens_ptr, stride_0, stride_1, next_n,
                      state_ptr, width, MODE: tl.constexpr, CAP: tl.constexpr, SAMPLE: tl.constexpr, RUN: tl.constexpr,
                      SLACK: tl.constexpr, PDL: tl.constexpr):
    let_dependents_launch(PDL)
    row = tl.program_id(0).to(tl.int64)
    start, end = _row_range(row, starts_ptr, ends_ptr, lens_ptr, stride_0, stride_1, next_n, MODE)
    n = end - start
    tau = tl.full((), 1, tl.uint32)
    if n > CAP:
        col, live = sample_columns(start, n, SAMPLE, RUN)
        x = tl.load(logits_ptr + row * stride_r + col.to(tl.int64) * stride_c, mask=col < _load_end(end, width),
                    other=0.0)
        tau = sample_threshold(live_key(sort_key(x), live), n, CAP, SLACK)
    store_state(state_ptr, row, tau)


@triton.jit(do_not_specialize_on_alignment=["starts_ptr", "ends_ptr", "lens_ptr"])
def _filter_kernel(logits_ptr, stride_r, stride_c, starts_ptr, ends_ptr, lens_ptr, stride_0, stride_1, next_n,
                   state_ptr, cand_ptr, chunk, width, MODE: tl.constexpr, CAP: tl.constexpr,
                   BLOCK: tl.constexpr, LANES: tl.constexpr, WARPS: tl.constexpr, PDL: tl.constexpr):
    let_dependents_launch(PDL)
    row = tl.program_id(0).to(tl.int64)
    start, end = _row_range(row, starts_ptr, ends_ptr, lens_ptr, stride_0, stride_1, next_n, MODE)
    first, lo, hi, load_end = _piece(start, end, tl.program_id(1), chunk, width)
    src = logits_ptr + row * stride_r
    columns = filter_columns(LANES, WARPS, BLOCK // (LANES * WARPS))
    first_columns = first + columns              # not `c`: the loop's `c` may be int64
    x = tl.load(src + first_columns.to(tl.int64) * stride_c, mask=first_columns < load_end, other=0.0)
    wait_for_prior_grid(PDL)
    tau = load_tau(state_ptr, row)
    cand = cand_ptr + row * (2 * CAP)
    count_ptr = count_pointer(state_ptr, row)
    for block_first in range(first, hi, BLOCK):  # each block's keys are loaded one block ahead
        c = block_first + columns
        following = c + BLOCK
        x_following = tl.load(src + following.to(tl.int64) * stride_c, mask=following < load_end, other=0.0)
        append_at_least(cand, count_ptr, live_key(sort_key(x), (c >= lo) & (c < hi)), block_first, tau, CAP)
        x = x_following


@triton.jit(do_not_specialize_on_alignment=["starts_ptr", "ends_ptr", "lens_ptr"])
def _collect_kernel(logits_ptr, stride_r, stride_c, starts_ptr, ends_ptr, lens_ptr, stride_0, stride_1, next_n,
                    state_ptr, cand_ptr, out_ptr, out_stride, k, MODE: tl.constexpr, CAP: tl.constexpr,
                    PDL: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    start, end = _row_range(row, starts_ptr, ends_ptr, lens_ptr, stride_0, stride_1, next_n, MODE)
    wait_for_prior_grid(PDL)
    count, complete = collected(state_ptr, row, tl.minimum(k, end - start), CAP)
    dst = out_ptr + row * out_stride
    if complete:
        want = collect(cand_ptr + row * (2 * CAP), count, k, start, dst, CAP)
    else:                                        # the sample misjudged the row: select from the row itself
        want = _select_streamed(logits_ptr + row * stride_r, stride_c, cand_ptr, start, start, end, end, k, start,
                                dst, False, CAP)
    pad(dst, want, k, CAP)


def indexer_topk(target: Target, a):
    R, W = a.logits.shape
    out = topk_output(a)
    if R == 0:
        return out
    tune = target.tuning
    if a.seq_lens is None:
        mode, starts, ends, lens, next_n = 0, a.row_starts, a.row_ends, out, 1
        strides = (a.row_starts.stride(0), a.row_ends.stride(0))
    else:
        two_d = a.seq_lens.dim() == 2
        mode, starts, ends, lens = (2 if two_d else 1), out, out, a.seq_lens
        next_n = a.seq_lens.shape[1] if two_d else a.next_n
        strides = (a.seq_lens.stride(0), a.seq_lens.stride(1) if two_d else 0)
    rows = (a.logits, a.logits.stride(0), a.logits.stride(1), starts, ends, lens, *strides, next_n)
    sms = multiprocessors(a.logits.device)
    bound = load_bound(a.logits)
    if by_threshold(W, a.k, tune):
        return _by_threshold(target, rows, bound, mode, a.k, out, sms)
    pieces, piece = _split(R, W, a.k, tune, sms)
    launch = functools.partial(_launch, rows, bound, mode, tune, target.warp_lanes, a.k)
    if pieces == 1:                              # one program per row (its one piece: the whole row)
        launch((R, 1), out, 0, 0, out, a.k, _round16(W), W, gather=False, local=True)
        return out
    n_cand = pieces * a.k                        # stage 1: each piece's k largest columns
    cand = torch.empty(R, _round16(n_cand), dtype=torch.int32, device=a.logits.device)
    launch((R, pieces), cand, 0, 0, cand, cand.stride(0), piece, piece, gather=False, local=False)
    launch((R, 1), cand, cand.stride(0), n_cand, out, a.k, _round16(W), n_cand, gather=True, local=True)
    return out


def by_threshold(W: int, k: int, tune) -> bool:
    """Whether rows of width W run the threshold path: at least ``topk_threshold_min`` columns, more
    than the candidate slots, and the slots fit one collect program."""
    cap = threshold_topk.capacity(k)
    return W >= tune.topk_threshold_min and W > cap and threshold_topk.fits(k)


def _by_threshold(target: Target, rows: tuple, bound: int, mode: int, k: int, out, sms: int):
    """Sample, filter, collect (threshold_topk.py) into ``out``."""
    tune, lanes = target.tuning, target.warp_lanes
    logits = rows[0]
    R, W = logits.shape
    cap = threshold_topk.capacity(k)
    sample = threshold_topk.sample_size(tune, W, cap)
    cand, state = threshold_topk.workspace(R, cap, logits.device)
    pieces = max(1, min(triton.cdiv(tune.topk_filter_programs * sms, R), triton.cdiv(W, tune.topk_filter_block)))
    keys_per_thread = tune.topk_keys_per_thread
    pdl = target.pdl
    _threshold_kernel[(R,)](*rows, state, bound, MODE=mode, CAP=cap, SAMPLE=sample, RUN=min(32, sample),
                            SLACK=tune.topk_sample_slack, PDL=pdl,
                            num_warps=resident_warps(sample, keys_per_thread, lanes))
    _filter_kernel[(R, pieces)](*rows, state, cand, _round16(triton.cdiv(W, pieces)), bound, MODE=mode, CAP=cap,
                                BLOCK=max(tune.topk_filter_block, lanes * tune.topk_filter_warps), LANES=lanes,
                                WARPS=tune.topk_filter_warps, PDL=pdl, num_warps=tune.topk_filter_warps,
                                **pdl_launch(pdl))
    _collect_kernel[(R,)](*rows, state, cand, out, k, k, MODE=mode, CAP=cap, PDL=pdl,
                          num_warps=resident_warps(cap, keys_per_thread, lanes), **pdl_launch(pdl))
    return out


def _round16(n: int) -> int:
    return -(-n // 16) * 16


def _pieces(R: int, W: int, longest: int, shortest: int, sms: int) -> int:
    """Pieces a row of W columns is split into: none longer than ``longest``, and more when R rows
    do not fill the multiprocessors, none shorter than ``shortest``."""
    pieces = triton.cdiv(W, longest)
    if R < sms:
        pieces = max(pieces, min(triton.cdiv(sms, R), W // shortest))
    return max(pieces, 1)


def _split(R: int, W: int, k: int, tune, sms: int) -> tuple[int, int]:
    """(pieces per row, columns per piece): enough pieces that each fits a resident block and that
    R * pieces fills the multiprocessors, none shorter than ``topk_min_piece`` or 2k."""
    pieces = _pieces(R, W, tune.topk_resident, max(tune.topk_min_piece, 2 * k), sms)
    if pieces == 1:
        return 1, W
    return pieces, _round16(max(triton.cdiv(W, pieces), k))


def launch_variant(span: int, tune, lanes: int) -> tuple[bool, int, int]:
    """(RESIDENT, BLOCK, warps) of a launch whose programs each select among ``span`` positions:
    resident (a power-of-two width class) when they fit ``topk_resident``, else streamed."""
    resident = span <= tune.topk_resident
    block = triton.next_power_of_2(max(span, 16)) if resident else tune.topk_block
    warps = resident_warps(block, tune.topk_keys_per_thread, lanes) if resident else tune.topk_warps
    return resident, block, warps


def pitch_class(stride: int) -> int:
    """How Triton specializes an integer argument such as the row pitch: 1, 16 (a multiple of 16) or 0."""
    return 1 if stride == 1 else 16 if stride % 16 == 0 else 0


def load_bound(logits: torch.Tensor) -> int:
    """The column the kernels load below (``_piece``'s ``width``): the logits' width W, or, where
    W's class (``pitch_class``) differs from the row pitch's, W raised to the pitch's class (to a
    multiple of 16, or by one) when the tensor's storage holds those columns of every row. Triton
    specializes both integers, so a strided call compiles the variant a contiguous call of its row
    pitch compiles (the one warm-up reaches); the columns past W are read, never kept."""
    R, W = logits.shape
    pitch = pitch_class(logits.stride(0))
    if pitch in (1, pitch_class(W)):
        return W
    bound = _round16(W) if pitch == 16 else W + 1
    last = logits.storage_offset() + (R - 1) * logits.stride(0) + (bound - 1) * logits.stride(1)
    return bound if last * logits.element_size() < logits.untyped_storage().nbytes() else W


def launch_variants(R: int, W: int, k: int, tune, lanes: int, sms: int) -> tuple[tuple, ...]:
    """The compile-time choices of a call with R contiguous rows of width W: (GATHER, LOCAL,
    RESIDENT, BLOCK, warps, row pitch class) per launch (one launch, or the pieces' and the
    candidates' selections)."""
    pitch = pitch_class(W)
    if by_threshold(W, k, tune):
        cap = threshold_topk.capacity(k)
        return (("threshold", cap, threshold_topk.sample_size(tune, W, cap), pitch),)
    pieces, piece = _split(R, W, k, tune, sms)
    if pieces == 1:
        return ((False, True, *launch_variant(W, tune, lanes), pitch),)
    return ((False, False, *launch_variant(piece, tune, lanes), pitch),
            (True, True, *launch_variant(pieces * k, tune, lanes), pitch))


def _launch(rows, bound, mode, tune, lanes, k, grid, cand, cand_stride, n_cand, out, out_stride, chunk, span, *, gather,
            local):
    """One launch whose programs each select among ``span`` positions (``launch_variant``)."""
    resident, block, warps = launch_variant(span, tune, lanes)
    _indexer_topk_kernel[grid](*rows, cand, cand_stride, n_cand, out, out_stride, k, chunk, bound,
                               MODE=mode, GATHER=gather,
                               LOCAL=local, BLOCK=block, RESIDENT=resident, num_warps=warps)


def warmup_calls(dims, limits, machine) -> list[dict]:
    """Warm-up (``dsv4ops.warmup``): per row mode (``topk_modes``), the (rows, width) calls of
    ``topk_sizes`` up to ``max_tokens`` rows and the widest indexer row."""
    tune, lanes = tuning(machine.platform), warp_lanes(machine.platform)
    calls = []
    for mode in limits.topk_modes:
        step = 1 if mode == "ranges" else limits.next_n
        for R, W in topk_sizes(dims.index_topk, limits.max_tokens, limits.index_width, tune, lanes, machine.sms, step):
            calls.append(dict(R=R, W=W, k=dims.index_topk, mode=mode, next_n=step))
    return calls


@functools.lru_cache(maxsize=16)
def topk_sizes(k: int, max_rows: int, max_width: int, tune, lanes: int, sms: int,
               step: int = 1) -> tuple[tuple[int, int], ...]:
    """(rows, width) calls, rows a multiple of ``step`` (MTP rows per request), that together reach
    every launch variant (``launch_variants``: one launch, or pieces then candidates, each resident
    at a power-of-two width class or streamed; or the threshold path, whose sample grows with the
    width's power-of-two class) up to the limits. Widths: powers of two, p times them (pieces of
    exactly that class), one more and 16 more (row pitch classes 1 and 16 just past a class
    boundary); rows: the smallest of each ``cdiv(sms, rows)`` class (fewer rows split more), and the
    most."""
    row_set = {min(max_rows, -(-max_rows // step) * step)}
    for r in range(step, min(max_rows, sms + step) + 1, step):
        row_set.add(r)
    by_class = {}
    for r in sorted(row_set):
        by_class.setdefault(-(-sms // r) if r < sms else 0, r)
    pieces = max(-(-max_width // tune.topk_resident), sms)
    widths = {max_width}
    b = 1
    while b <= max_width:
        widths.update(w for p in range(1, pieces + 1) for w in (p * b, p * b + 1, p * b + 16) if w <= max_width)
        b *= 2
    seen, calls = set(), []
    for r in by_class.values():
        for w in sorted(widths):
            new = set(launch_variants(r, w, k, tune, lanes, sms)) - seen
            if new:
                seen |= new
                calls.append((r, w))
    return tuple(calls)
