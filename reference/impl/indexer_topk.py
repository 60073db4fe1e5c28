"""Reference for op 5, docs/ops.md §5: row-local indices of the k largest valid logits."""
from __future__ import annotations

import torch

from dsv4ops.rows import row_bounds


def indexer_topk(a):
    R, W = a.logits.shape
    starts, ends = row_bounds(a.row_starts, a.row_ends, a.seq_lens, a.next_n)
    cols = torch.arange(W, device=a.logits.device)
    valid = (cols >= starts[:, None]) & (cols < ends[:, None])
    count = valid.sum(1)
    # Largest first; valid columns before invalid ones even when both are -inf.
    order = torch.sort(torch.where(valid, a.logits, float("-inf")), dim=1, descending=True, stable=True).indices
    invalid_first = (~valid.gather(1, order)).to(torch.int8)
    order = order.gather(1, torch.sort(invalid_first, dim=1, stable=True).indices)
    if W < a.k:
        order = torch.nn.functional.pad(order, (0, a.k - W))
    chosen = order[:, :a.k] - starts[:, None]
    filled = torch.arange(a.k, device=a.logits.device) < count[:, None]
    result = torch.where(filled, chosen, -1).to(torch.int32)
    return result if a.out is None else a.out.copy_(result)
