"""Top-k through a sampled threshold: the pieces shared by indexer_topk and the fused indexers
(docs/ops.md §5, §12, §13).

Three kernels per call, each over every row:

1. **threshold**: from a sample of the row's keys (``SAMPLE`` keys in evenly spaced runs of
   consecutive columns), ``tau``, a sample key above which ``CAP / 2`` to ``CAP / 2 * (1 + 1 /
   SLACK)`` of the row's live keys are expected (``sample_threshold``); 1, every live key, when the
   row has at most ``CAP``. The row's candidate count is zeroed.
2. **filter**: programs over the row's keys append every live key ``>= tau``, with its column, to
   the row's ``CAP`` candidate slots, each warp reserving its positions with one atomic add per
   block (``append_at_least``). Every key is read once; nothing else is written.
3. **collect**: when the count is in ``[want, CAP]`` (``want = min(k, live keys)``) every key of
   the row's top ``want`` is ``>= tau`` and all of them were kept, so the top ``k`` of the
   candidates is the row's (``collect``). Otherwise the sample misjudged the row (thousands of
   keys equal at the threshold, logits sorted along the row) and the collect program selects
   exactly from the row itself, slowly but correctly.

Workspace, per call: int32 ``[rows, 2, CAP]`` candidates (order-preserving uint32 keys, then
columns) and int32 ``[rows, STATE]`` (``tau``, count, then padding: each row's count, which every
filter warp's atomic adds hit, on its own 128-byte line; counts sharing a line serialize the adds of
many rows in one L2 slice): ``rows * (2 * CAP + STATE) * 4`` bytes, independent of the row length.
``CAP`` is ``4 * k`` rounded up to a power of two (``capacity``): with a 2048-key
sample of a 32768-key row and ``k = 512`` the expected count is 1024 to 1280 (``SLACK`` 4) with a
standard deviation about 128, four deviations from either end.

With PDL (``Target.pdl``) the filter and collect kernels are launched while the previous kernel runs:
the filter loads its first block (an input) before it waits for the threshold kernel; the collect
waits before it reads anything the filter writes.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from .kth import kth_largest, kth_largest_within, selection_slots

MAX_CAP = 32768             # candidate slots a collect program selects from in registers (16-bit slot counts)
STATE = tl.constexpr(32)    # int32 per row of the state: tau, count, padding to 128 bytes
SAMPLED_RANK = 64           # the sample's rank of tau at the widest row: the count deviates about 1/8 (4 deviations to either end)


def capacity(k: int) -> int:
    """Candidate slots per row for ``k``: ``4 * k`` (at least 16) rounded up to a power of two."""
    return triton.next_power_of_2(max(4 * k, 16))


def fits(k: int) -> bool:
    """Whether a row's candidates for ``k`` fit one collect program (``MAX_CAP``)."""
    return capacity(k) <= MAX_CAP


def sample_size(tune, width: int, cap: int) -> int:
    """Keys sampled per row of at most ``width`` keys: enough that the sample's rank behind ``tau``
    is at least ``SAMPLED_RANK`` (relative deviation of the count about 1/sqrt of it), at least
    ``topk_sample``, at most ``MAX_CAP``; a power of two."""
    return min(MAX_CAP, max(tune.topk_sample, triton.next_power_of_2(-(-SAMPLED_RANK * width // (cap // 2)))))


def workspace(rows: int, cap: int, device) -> tuple[torch.Tensor, torch.Tensor]:
    """(candidates int32 ``[rows, 2, cap]``, state int32 ``[rows, STATE]``: tau, count, padding),
    uninitialised (the threshold kernel writes the state before the filter reads it)."""
    return (torch.empty(rows, 2, cap, dtype=torch.int32, device=device),
            torch.empty(rows, STATE.value, dtype=torch.int32, device=device))


def workspace_bytes(rows: int, cap: int) -> int:
    return rows * (2 * cap + STATE.value) * 4


@triton.jit
def sample_columns(start, n, SAMPLE: tl.constexpr, RUN: tl.constexpr):
    """(columns, live) of a sample of ``[start, start + n)``: ``SAMPLE // RUN`` runs of ``RUN``
    consecutive columns, evenly spaced (``RUN`` apart when ``n <= SAMPLE``: the range from ``start``
    rounded down to 16) and each starting at a multiple of 16, so that loads masked to 16-column
    groups are 16-byte vectors; columns outside the range are not live."""
    i = tl.arange(0, SAMPLE)
    col = (start + (i // RUN) * tl.maximum(n // (SAMPLE // RUN), RUN)) // 16 * 16 + i % RUN
    return col, (col >= start) & (col < start + n)


@triton.jit
def sample_threshold(key, n, CAP: tl.constexpr, SLACK: tl.constexpr):
    """``tau`` (uint32 >= 1) from sample keys ``key`` (live >= 1, dead 0) of a row with ``n`` live
    keys, ``n > CAP``: a sample key with ``rank`` to ``rank + rank // SLACK`` sample keys at or above
    it, ``rank = ceil(CAP / 2 * live / n)``. A sample with no live key gives all ones (nothing
    passes: the collect falls back)."""
    live = tl.sum((key > 0).to(tl.int32), axis=0)
    rank = tl.maximum(((CAP // 2) * live.to(tl.int64) + n - 1) // n, 1).to(tl.int32)
    tau, _ = kth_largest_within(key, rank, rank // SLACK)
    return tl.maximum(tau, 1)


@triton.jit
def store_state(state_ptr, row, tau):
    """The row's ``tau`` and a zero count."""
    tl.store(_tau_pointer(state_ptr, row), tau.to(tl.int32, bitcast=True))
    tl.store(count_pointer(state_ptr, row), 0)


@triton.jit
def load_tau(state_ptr, row):
    return tl.load(_tau_pointer(state_ptr, row)).to(tl.uint32, bitcast=True)


@triton.jit
def _tau_pointer(state_ptr, row):
    """Where the row's ``tau`` is: the first int32 of its ``STATE``."""
    return state_ptr + row * STATE


@triton.jit
def count_pointer(state_ptr, row):
    """Where the row's candidate count is (``append_at_least``): the second int32 of its ``STATE``."""
    return _tau_pointer(state_ptr, row) + 1


@triton.jit
def filter_columns(LANES: tl.constexpr, WARPS: tl.constexpr, VEC: tl.constexpr):
    """Column offsets of a filter block of ``LANES * WARPS * VEC`` keys: ``[LANES, WARPS, VEC // G, G]``
    (``G`` = 4, or ``VEC`` if smaller), lane ``l`` of warp ``w`` holding the ``VEC`` consecutive
    columns from ``_thread_first(l, w)``. Triton lays this shape out as it reads (4 keys per thread
    along the last axis, then lanes, then warps), so one thread holds ``[l, w, :, :]``: loads of
    ``G`` keys (16 bytes where the block starts at a multiple of 16 keys), and the sums and scans of
    ``append_at_least`` stay within a thread or a warp."""
    G: tl.constexpr = min(VEC, 4)
    v = tl.arange(0, VEC // G)[None, None, :, None] * G + tl.arange(0, G)[None, None, None, :]
    return _thread_first(LANES, WARPS, VEC)[:, :, None, None] + v


@triton.jit
def _thread_first(LANES: tl.constexpr, WARPS: tl.constexpr, VEC: tl.constexpr):
    """``[LANES, WARPS]``: the first column of each thread's keys in a filter block."""
    return (tl.arange(0, WARPS)[None, :] * LANES + tl.arange(0, LANES)[:, None]) * VEC


@triton.jit
def _register(x, r, g):
    """``x[:, :, r, g]`` of a filter block: each thread's own value (no data moves)."""
    at = (tl.arange(0, x.shape[2])[None, None, :, None] == r) & (tl.arange(0, x.shape[3])[None, None, None, :] == g)
    return tl.sum(tl.sum(tl.where(at, x, 0), axis=3), axis=2)


@triton.jit
def append_at_least(cand, count_ptr, key, block_first, tau, CAP: tl.constexpr):
    """Appends the entries of a filter block (``key`` uint32 from ``live_key``, over the columns
    ``block_first + filter_columns``, of its shape) whose key is at least ``tau`` (>= 1: dead keys
    never pass) to the row's candidates ``cand`` (keys, then the columns ``CAP`` slots on).
    ``count_ptr`` (``count_pointer``) counts every such entry, also those past ``CAP``.

    Each warp reserves its positions with one atomic add from its first lane and numbers its
    entries with a scan over its lanes; each thread then stores its own keys in turn: nothing goes
    through shared memory or waits on another warp. The add is relaxed: it only hands out distinct
    positions, and what the filter stores is read by the next kernel, after the grid ends (or after
    its ``griddepcontrol.wait``); the default (acq_rel) would fence every add, waiting on the loads
    in flight."""
    LANES: tl.constexpr = key.shape[0]
    WARPS: tl.constexpr = key.shape[1]
    R: tl.constexpr = key.shape[2]
    G: tl.constexpr = key.shape[3]
    keep = (key >= tau).to(tl.int32)
    mine = tl.sum(tl.sum(keep, axis=3), axis=2)                               # [LANES, WARPS]
    lane = tl.arange(0, LANES)[:, None] + mine * 0
    warp_total = tl.sum(mine, axis=0)[None, :] + lane * 0
    got = tl.atomic_add(count_ptr + lane * 0, warp_total, mask=(lane == 0) & (warp_total > 0), sem="relaxed")
    at = tl.max(tl.where(lane == 0, got, 0), axis=0)[None, :] + tl.cumsum(mine, axis=0) - mine
    column = block_first + _thread_first(LANES, WARPS, R * G)
    for r in tl.static_range(R):
        for g in tl.static_range(G):
            kept = _register(keep, r, g)
            stored = (kept > 0) & (at < CAP)
            tl.store(cand + at, _register(key, r, g).to(tl.int32, bitcast=True), mask=stored)
            tl.store(cand + CAP + at, column + r * G + g, mask=stored)
            at += kept


@triton.jit
def collected(state_ptr, row, want, CAP: tl.constexpr):
    """(count, whether the candidates hold the row's top ``want``: ``want <= count <= CAP``)."""
    count = tl.load(count_pointer(state_ptr, row))
    return count, (count >= want) & (count <= CAP)


@triton.jit
def collect(cand, count, k, base, dst, CAP: tl.constexpr):
    """The top ``k`` of the ``count`` candidates at ``cand`` to ``dst`` as ``column - base`` int32
    (ties as many as fill ``k``); returns how many (``min(k, count)``)."""
    slot = tl.arange(0, CAP)
    have = slot < count
    key = tl.load(cand + slot, mask=have, other=0).to(tl.uint32, bitcast=True)
    col = tl.load(cand + CAP + slot, mask=have, other=0)
    threshold, want = kth_largest(key, k)
    dst_slot, chosen = selection_slots(key, threshold, want)
    tl.store(dst + dst_slot, col - base, mask=chosen)
    return want
