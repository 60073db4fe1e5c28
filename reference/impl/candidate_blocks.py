"""Reference for op 14, docs/ops.md §14: candidate blocks of a row from its block scores."""
from __future__ import annotations

import torch

from dsv4ops.rows import row_bounds

INT32_MIN, INT32_MAX = -(2 ** 31), 2 ** 31 - 1


def block_keys(scores: torch.Tensor) -> torch.Tensor:
    """fp32 block scores -> int32 keys in the selection's order (docs/ops.md §14): finite and +inf
    scores by value (-0 read as +0), NaN above +inf, -inf (dropped) at INT32_MIN."""
    bits = scores.view(torch.int32)
    keys = bits ^ ((bits >> 31) & INT32_MAX)                 # the float order as signed integers
    keys = torch.where(scores == 0, 0, keys)
    keys = torch.where(scores.isnan(), INT32_MAX - 1, keys)
    return torch.where(scores == float("-inf"), INT32_MIN, keys)


def candidate_blocks(a):
    R, W = a.logits.shape
    bs, kb = a.sparse_block, a.num_blocks
    starts, ends = row_bounds(a.row_starts, a.row_ends, a.seq_lens, a.next_n)
    n = (ends - starts).clamp_min(0)
    nb = -(-W // bs)
    j = torch.arange(nb * bs, device=a.logits.device)
    visible = j[None, :] < n[:, None]
    cols = (starts[:, None] + j[None, :]).clamp(max=max(W - 1, 0))
    values = a.logits.gather(1, cols) if W else a.logits.new_empty(R, 0)
    values = torch.where(visible, values, float("-inf")).view(R, nb, bs)
    keys = block_keys(values.amax(2) if nb else values.new_empty(R, 0))       # amax propagates NaN
    newest = (n - 1).clamp_min(0) // bs
    blocks = torch.arange(nb, device=keys.device)
    keys = torch.where((blocks[None, :] == newest[:, None]) & (n[:, None] > 0), INT32_MAX, keys)
    order = keys.sort(dim=1, descending=True, stable=True).indices              # ties: lower block first
    counts = (keys > INT32_MIN).sum(1).clamp(max=kb)
    taken = torch.full((R, kb), nb, dtype=torch.int64, device=keys.device)
    width = min(kb, nb)
    taken[:, :width] = torch.where(torch.arange(width, device=keys.device)[None, :] < counts[:, None],
                                   order[:, :width], nb)
    taken = taken.sort(1).values
    out = torch.where(taken < nb, taken, -1).to(torch.int32)
    return out, counts.to(torch.int32)
