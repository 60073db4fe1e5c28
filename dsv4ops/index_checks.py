"""Argument checks the indexer ops share (docs/ops.md §3, §5, §11, §14 to §16): the query of the
logits ops, the row ranges of the ops over logits rows, the candidate blocks of the sparse logits."""
from __future__ import annotations

import torch

from . import formats
from .checker import INT32_MAX, Checker
from .rows import bad_candidate_rows


def check_query(c: Checker, q, q_scale, lead: tuple, mxfp4_keys: bool):
    """The query of paged_mqa_logits and mqa_logits: fp8 e4m3 ``[*lead, H, 128]`` with ``q_scale``
    None, or MXFP4 (MXFP4 keys only): packed e2m1 uint8 ``[*lead, H, 64]`` with UE8M0 bytes uint8
    ``[*lead, H, 4]``; both contiguous."""
    if q.dtype != torch.uint8:
        if q_scale is not None:
            c.fail("q_scale", f"must be None for fp8 q (it scales MXFP4 queries only), got {list(q_scale.shape)}")
        return
    if not mxfp4_keys:
        c.fail("q", "MXFP4 queries (uint8) need MXFP4 keys (68 B index_mxfp4), got fp8 keys: quantize q to fp8")
    c.tensor("q", q, shape=(*lead, "H", formats.INDEX_DIM // 2))
    if q_scale is None:
        c.fail("q_scale", "must be the UE8M0 bytes uint8 [..., H, 4] of the MXFP4 q, got None")
    c.tensor("q_scale", q_scale, dtype=torch.uint8, shape=(*q.shape[:-1], formats.INDEX_DIM // formats.MX_BLOCK),
             contiguous=True)


def check_row_lengths(c: Checker, a, R: int, W: int):
    """The two ways a call over ``R`` logits rows of width ``W`` gives each row's visible columns
    (docs/ops.md §5): ``row_starts`` / ``row_ends`` int32 ``[R]``, or ``seq_lens`` int32 ``[B]`` /
    ``[B, next_n]`` with ``next_n`` rows per request; exactly one of them."""
    c.int_arg("next_n", a.next_n, minimum=1)
    ranged = a.row_starts is not None or a.row_ends is not None
    seq_lens = a.seq_lens
    if ranged == (seq_lens is not None):
        c.fail("seq_lens", "give either row_starts and row_ends, or seq_lens (not both, not neither)")
    if ranged:
        c.tensor("row_starts", a.row_starts, dtype=torch.int32, shape=(R,))
        c.tensor("row_ends", a.row_ends, dtype=torch.int32, shape=(R,))
        c.in_range("row_starts", a.row_starts, 0, W + 1, what="row starts")
        c.in_range("row_ends", a.row_ends, 0, W + 1, what="row ends")
        c.not_above("row_starts", a.row_starts, "row_ends", a.row_ends)
    else:
        if not isinstance(seq_lens, torch.Tensor) or seq_lens.dim() not in (1, 2):
            c.fail("seq_lens", "must be int32 [B] or [B, next_n]")
        if seq_lens.dim() == 2 and a.next_n not in (1, seq_lens.shape[1]):
            c.fail("next_n", f"must match seq_lens.shape[1]={seq_lens.shape[1]}, got {a.next_n}")
        rows_per_seq = seq_lens.shape[1] if seq_lens.dim() == 2 else a.next_n
        c.tensor("seq_lens", seq_lens, dtype=torch.int32, shape=("B",) + tuple(seq_lens.shape[1:]))
        if seq_lens.shape[0] * rows_per_seq != R:
            c.fail("seq_lens", f"describes B={seq_lens.shape[0]} requests x next_n={rows_per_seq} = "
                               f"{seq_lens.shape[0] * rows_per_seq} rows, but the call has R={R} rows (R must be "
                               f"B * next_n)")
        c.in_range("seq_lens", seq_lens, 0, W + 1, what="lengths (at most the logits width)")


def check_blocks(c: Checker, a, rows: int, lens):
    """``blocks`` and ``sparse_block`` of paged_sparse_mqa_logits and sparse_mqa_logits (§15, §16): int32
    [rows, num_blocks],
    any strides; per row ascending visible blocks, then -1 (a value check)."""
    c.int_arg("sparse_block", a.sparse_block, minimum=1)
    c.tensor("blocks", a.blocks, dtype=torch.int32, shape=(rows, "num_blocks"))
    width = a.blocks.shape[1] * a.sparse_block
    if width > INT32_MAX:
        c.fail("blocks", f"must keep num_blocks * sparse_block <= {INT32_MAX}, got {a.blocks.shape[1]} * "
                         f"{a.sparse_block}")
    if c.values_checked(a.blocks) and rows:
        bad = bad_candidate_rows(a.blocks, lens.to(a.blocks.device), a.sparse_block)
        if bool(bad.any()):
            c.fail("blocks", f"rows must hold strictly ascending blocks b with 0 <= b < ceil(n / sparse_block) "
                             f"(n the row's visible count), then only -1; row {int(torch.nonzero(bad)[0])} does not")
    return width
