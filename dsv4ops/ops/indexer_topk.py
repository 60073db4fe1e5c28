"""Op 5 (docs/ops.md §5): per-row top-k of indexer logits, row-local indices, -1 padded."""
from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor

from ..opspec import Arg, OpSpec, define
from ..checker import INT32_MAX, Checker


def check(c: Checker, a):
    c.tensor("logits", a.logits, dtype=torch.float32, shape=("R", "W"), anchor=True)
    R, W = a.logits.shape
    c.size_limit("logits", W, what="width W (row-local indices are int32)")
    c.int_arg("k", a.k, minimum=1)
    if a.k > INT32_MAX - W:
        c.fail("k", f"must keep W + k <= {INT32_MAX} (int32 candidate columns), got k={a.k} with W={W}")
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
        c.tensor("seq_lens", seq_lens, dtype=torch.int32, shape=(R // rows_per_seq,) + tuple(seq_lens.shape[1:]))
        if seq_lens.shape[0] * rows_per_seq != R:
            c.fail("seq_lens", f"must describe R={R} rows (B * next_n), got {list(seq_lens.shape)} "
                               f"with next_n={rows_per_seq}")
        c.in_range("seq_lens", seq_lens, 0, W + 1, what="lengths (at most the logits width)")
    c.out_buffer(a.out, dtype=torch.int32, shape=(R, a.k))
    c.disjoint(a, "out")
    return a


def fake(a):
    return a.logits.new_empty(a.logits.shape[0], a.k, dtype=torch.int32)


SPEC = OpSpec(
    name="indexer_topk",
    doc="""logits fp32 [R, W]; rows either [row_starts, row_ends) (int32 [R]) or decode lengths
    ``seq_lens`` int32 [B] (with next_n) / [B, next_n]; inputs of any strides. Returns int32 [R, k]:
    row-local columns of the k largest valid logits (order unspecified), -1 past the row's valid count.""",
    args=(
        Arg("logits", Tensor), Arg("k", int),
        Arg("row_starts", Optional[Tensor], None, keyword_only=True),
        Arg("row_ends", Optional[Tensor], None, keyword_only=True),
        Arg("seq_lens", Optional[Tensor], None, keyword_only=True),
        Arg("next_n", int, 1, keyword_only=True),
        Arg("out", Optional[Tensor], None, keyword_only=True, mutated=True),
    ),
    outputs="Tensor",
    check=check,
    fake=fake,
)
OP = define(SPEC)
indexer_topk = OP.function
