"""dsv4ops indexer_topk -> ``flashinfer.topk.top_k_ragged_transform``.

FlashInfer selects over ``[row_starts, row_starts + lengths)`` and returns the row-local index
plus ``offsets``; with zero offsets that is exactly the dsv4ops contract (row-local, -1 padded).
"""
from __future__ import annotations

import torch

from dsv4ops.ops._rows import row_bounds


def indexer_topk(logits, k, *, row_starts=None, row_ends=None, seq_lens=None, next_n=1, out=None):
    from flashinfer.topk import top_k_ragged_transform

    R = logits.shape[0]
    result = torch.empty(R, k, dtype=torch.int32, device=logits.device) if out is None else out
    if R == 0:
        return result
    starts, ends = row_bounds(row_starts, row_ends, seq_lens, next_n)
    lengths = (ends - starts).clamp_min(0).to(torch.int32)
    offsets = torch.zeros(R, dtype=torch.int32, device=logits.device)
    got = top_k_ragged_transform(logits.contiguous(), offsets, lengths, k,
                                 row_starts=starts.to(torch.int32) if row_starts is not None else None)
    return result.copy_(got)
