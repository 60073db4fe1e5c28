"""Selection while scoring, shared by the fused indexers (ops 12 and 13, docs/ops.md §12).

Stage 1: program (row, piece) scores every ``pieces``-th key tile of its row and offers each tile to
``offer``, which keeps a candidate buffer of ``CAP = k + max(k, BLOCK_T)`` entries in the program's
slice of the workspace: a tile's entries above the running threshold are appended (positions by
``tl.cumsum``); when they would overflow it, the buffer first keeps only its ``k`` best
(``kth_largest``, in registers) and the threshold rises to the k-th largest key (later entries must
exceed it: ``k`` entries at least as large are already kept, so ties keep the earliest). ``finish``
leaves the piece's best ``min(k, entries)`` in the buffer's first ``k`` slots, empty slots as key 0.
Stage 2 (``_merge_kernel``): one program per row selects the top ``k`` of the pieces' ``pieces * k``.

Workspace: int32 ``[rows, pieces, 2, CAP]`` (order-preserving uint32 keys of the fp32 logits, 0 for
an empty slot, then columns): ``rows * pieces * CAP * 8`` bytes, ``pieces`` from the rows and the
multiprocessors only (``plan``), never from the context length.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from dsv4ops.platform import multiprocessors

from .kth import kth_largest, live_key, pad, resident_warps, selection_slots, sort_key
from .tuning import FUSED_MAX_BLOCK, Target, fused_cap


@triton.jit
def live_keys(logits, live):
    """Order-preserving uint32 keys of fp32 ``logits``, at least 1 where ``live`` and 0 elsewhere."""
    return live_key(sort_key(logits), live)


@triton.jit
def _keep_best(buf, count, k, CAP: tl.constexpr, BLOCK: tl.constexpr):
    """Reorder the ``count`` entries at ``buf`` so that their best ``min(k, count)`` come first;
    returns (the k-th largest key, how many were kept)."""
    tl.debug_barrier()                          # the program's earlier appends are visible
    slot = tl.arange(0, BLOCK)
    key = tl.load(buf + slot, mask=slot < count, other=0).to(tl.uint32, bitcast=True)
    col = tl.load(buf + CAP + slot, mask=slot < count, other=-1)
    threshold, kept = kth_largest(key, k)
    dst, chosen = selection_slots(key, threshold, kept)
    tl.debug_barrier()                          # every entry read before any is overwritten
    tl.store(buf + dst, key.to(tl.int32, bitcast=True), mask=chosen)
    tl.store(buf + CAP + dst, col, mask=chosen)
    tl.debug_barrier()
    return threshold, kept


@triton.jit
def offer(buf, count, threshold, key, col, k, CAP: tl.constexpr, BLOCK: tl.constexpr):
    """Append the entries of a tile (``key`` uint32 from ``live_keys``, ``col`` int32, any block)
    whose key exceeds ``threshold``, compacting first when they would overflow the ``CAP`` slots.
    Returns the new (count, threshold)."""
    keep = key > threshold
    n = tl.sum(keep.to(tl.int32), axis=0)
    if count + n > CAP:                         # then count > k: k entries stay, CAP - k >= a tile
        threshold, count = _keep_best(buf, count, k, CAP, BLOCK)
        keep = key > threshold
        n = tl.sum(keep.to(tl.int32), axis=0)
    pos = count + tl.cumsum(keep.to(tl.int32), axis=0) - 1
    tl.store(buf + pos, key.to(tl.int32, bitcast=True), mask=keep)
    tl.store(buf + CAP + pos, col, mask=keep)
    return count + n, threshold


@triton.jit
def finish(buf, count, k, CAP: tl.constexpr, BLOCK: tl.constexpr):
    """The piece's best ``min(k, count)`` entries into slots ``0..``; empty slots up to ``k`` get key 0."""
    kept = count
    if count > k:
        _, kept = _keep_best(buf, count, k, CAP, BLOCK)
    slot = tl.arange(0, BLOCK)
    tl.store(buf + slot, tl.zeros((BLOCK,), tl.int32), mask=(slot >= kept) & (slot < k))


@triton.jit(do_not_specialize=["out_stride", "stride_s"], do_not_specialize_on_alignment=["starts_ptr"])
def _merge_kernel(ws_ptr, pieces, k, out_ptr, out_stride, starts_ptr, stride_s, CAP: tl.constexpr,
                  BLOCK: tl.constexpr, HAS_STARTS: tl.constexpr):
    """Row ``program_id(0)``: the top ``k`` of its pieces' candidates as int32 columns (minus the
    row's start when ``HAS_STARTS``), then -1 up to ``k``."""
    row = tl.program_id(0).to(tl.int64)
    p = tl.arange(0, BLOCK)
    live = p < pieces * k
    entry = ws_ptr + (row * pieces + p // k) * (2 * CAP) + p % k
    key = tl.load(entry, mask=live, other=0).to(tl.uint32, bitcast=True)
    col = tl.load(entry + CAP, mask=live, other=-1)
    threshold, want = kth_largest(key, k)
    dst, chosen = selection_slots(key, threshold, want)
    base = tl.load(starts_ptr + row * stride_s) if HAS_STARTS else 0
    out_row = out_ptr + row * out_stride
    tl.store(out_row + dst, col - base, mask=chosen)
    pad(out_row, want, k, BLOCK)


@dataclass(frozen=True)
class Plan:
    """A fused call's pieces per row, candidate slots per piece and register blocks (stage 1, 2)."""

    pieces: int
    cap: int
    block: int
    merge_block: int

    def workspace_bytes(self, rows: int) -> int:
        return rows * self.pieces * self.cap * 8


def plan(rows: int, k: int, tile: int, tune, sms: int) -> Plan:
    """Pieces: about ``fused_programs_per_sm`` programs per multiprocessor, at most
    ``fused_max_pieces`` a row and ``FUSED_MAX_BLOCK // k`` (stage 2 holds them all), for a ``k``
    that ``tuning.fused_topk_fits``."""
    pieces = max(1, min(tune.fused_max_pieces, FUSED_MAX_BLOCK // k, triton.cdiv(tune.fused_programs_per_sm * sms, rows)))
    cap = fused_cap(k, tile)
    return Plan(pieces, cap, triton.next_power_of_2(cap), triton.next_power_of_2(max(pieces * k, 16)))


def workspace(target: Target, rows: int, k: int, tile: int, device) -> tuple[Plan, torch.Tensor]:
    """The call's plan and its (uninitialised) int32 workspace ``[rows, pieces, 2, cap]``."""
    p = plan(rows, k, tile, target.tuning, multiprocessors(device))
    return p, torch.empty(rows, p.pieces, 2, p.cap, dtype=torch.int32, device=device)


def stage_warps(block: int, target: Target) -> int:
    """Warps of a program holding ``block`` candidates in registers (as the resident top-k)."""
    return resident_warps(block, target.tuning.topk_keys_per_thread, target.warp_lanes)


def merge(target: Target, p: Plan, ws: torch.Tensor, k: int, out: torch.Tensor, starts=None) -> torch.Tensor:
    """Stage 2 into ``out`` int32 ``[rows, k]`` (row stride any); ``starts`` int32 ``[rows]`` or None."""
    rows = out.shape[0]
    _merge_kernel[(rows,)](ws, p.pieces, k, out, out.stride(0), out if starts is None else starts,
                           0 if starts is None else starts.stride(0), CAP=p.cap, BLOCK=p.merge_block,
                           HAS_STARTS=starts is not None, num_warps=stage_warps(p.merge_block, target))
    return out


def fused_topk_rows(k: int, tile: int, max_rows: int, tune, sms: int, step: int = 1) -> tuple[int, ...]:
    """Warm-up: row counts (multiples of ``step``, at most ``max_rows``) that together reach every
    pieces count of ``plan`` (it sets the merge's block and specializes ``pieces == 1``): the fewest
    rows of each."""
    by_pieces = {}
    most = min(max_rows, tune.fused_programs_per_sm * sms + step)
    for rows in range(step, max(most, step) + 1, step):
        by_pieces.setdefault(plan(rows, k, tile, tune, sms).pieces, rows)
    return tuple(by_pieces.values())
