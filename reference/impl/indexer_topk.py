"""Reference for op 5, docs/ops.md §5: row-local indices of the k largest valid logits."""
from __future__ import annotations

import torch

from dsv4ops.rows import row_bounds


def indexer_topk(a):
    starts, ends = row_bounds(a.row_starts, a.row_ends, a.seq_lens, a.next_n)
    result = top_k(a.logits, a.k, starts, ends)
    return result if a.out is None else a.out.copy_(result)


def top_k(logits: torch.Tensor, k: int, starts: torch.Tensor, ends: torch.Tensor) -> torch.Tensor:
    """int32 [R, k]: per row of fp32 ``logits [R, W]`` the columns of its k largest logits in
    [starts, ends) (int64 [R] each), relative to starts, largest first, then -1."""
    R, W = logits.shape
    cols = torch.arange(W, device=logits.device)
    valid = (cols >= starts[:, None]) & (cols < ends[:, None])
    count = valid.sum(1)
    # Largest first; valid columns before invalid ones even when both are -inf.
    order = torch.sort(torch.where(valid, logits, float("-inf")), dim=1, descending=True, stable=True).indices
    invalid_first = (~valid.gather(1, order)).to(torch.int8)
    order = order.gather(1, torch.sort(invalid_first, dim=1, stable=True).indices)
    if W < k:
        order = torch.nn.functional.pad(order, (0, k - W))
    chosen = order[:, :k] - starts[:, None]
    filled = torch.arange(k, device=logits.device) < count[:, None]
    return torch.where(filled, chosen, -1).to(torch.int32)
