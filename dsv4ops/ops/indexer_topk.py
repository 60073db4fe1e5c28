"""Op 5 (spec §5, Decision 3): per-row top-k of indexer logits, row-local indices, -1 padded."""
from __future__ import annotations

import torch

from ..selection import OpCall, call_op, signature_of
from ._validate import Checker

NAME = "indexer_topk"


def validate(logits, k, *, row_starts=None, row_ends=None, seq_lens=None, next_n=1, out=None) -> OpCall:
    c = Checker(NAME)
    c.tensor("logits", logits, dtype=torch.float32, shape=("R", "W"), anchor=True)
    R, W = logits.shape
    c.int_arg("k", k, minimum=1)
    c.int_arg("next_n", next_n, minimum=1)
    ranged = row_starts is not None or row_ends is not None
    if ranged == (seq_lens is not None):
        c.fail("seq_lens", "give either row_starts and row_ends, or seq_lens (not both, not neither)")
    if ranged:
        c.tensor("row_starts", row_starts, dtype=torch.int32, shape=(R,))
        c.tensor("row_ends", row_ends, dtype=torch.int32, shape=(R,))
        c.in_range("row_starts", row_starts, 0, W + 1, what="row starts")
        c.in_range("row_ends", row_ends, 0, W + 1, what="row ends")
        c.not_above("row_starts", row_starts, "row_ends", row_ends)
    else:
        if not isinstance(seq_lens, torch.Tensor) or seq_lens.dim() not in (1, 2):
            c.fail("seq_lens", "must be int32 [B] or [B, next_n]")
        if seq_lens.dim() == 2 and next_n not in (1, seq_lens.shape[1]):
            c.fail("next_n", f"must match seq_lens.shape[1]={seq_lens.shape[1]}, got {next_n}")
        rows_per_seq = seq_lens.shape[1] if seq_lens.dim() == 2 else next_n
        c.tensor("seq_lens", seq_lens, dtype=torch.int32, shape=(R // rows_per_seq,) + tuple(seq_lens.shape[1:]))
        if seq_lens.shape[0] * rows_per_seq != R:
            c.fail("seq_lens", f"must describe R={R} rows (B * next_n), got {list(seq_lens.shape)} "
                               f"with next_n={rows_per_seq}")
        c.in_range("seq_lens", seq_lens, 0, W + 1, what="lengths (at most the logits width)")
    c.out_buffer(out, dtype=torch.int32, shape=(R, k))
    kwargs = dict(logits=logits, k=k, row_starts=row_starts, row_ends=row_ends, seq_lens=seq_lens,
                  next_n=next_n, out=out)
    return OpCall(NAME, kwargs, logits.device, signature_of(kwargs))


def indexer_topk(logits, k, *, row_starts=None, row_ends=None, seq_lens=None, next_n=1, out=None,
                 backend=None):
    """logits fp32 [R, W]; rows either [row_starts, row_ends) (int32 [R]) or decode lengths
    ``seq_lens`` int32 [B] (with next_n) / [B, next_n]. Returns int32 [R, k]: row-local columns of
    the k largest valid logits (order unspecified), -1 past the row's valid count."""
    return call_op(validate, dict(logits=logits, k=k, row_starts=row_starts, row_ends=row_ends, seq_lens=seq_lens,
                                  next_n=next_n, out=out), backend)
