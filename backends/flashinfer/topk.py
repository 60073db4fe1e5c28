"""dsv4ops indexer_topk -> ``flashinfer.topk.top_k_ragged_transform``.

FlashInfer selects over ``[row_starts, row_starts + lengths)`` and returns the row-local index
plus ``offsets``; with zero offsets that is exactly the dsv4ops contract (row-local, -1 padded).
"""
from __future__ import annotations

import torch

from dsv4ops.backend_support import topk_output
from dsv4ops.rows import row_bounds


def indexer_topk(a):
    from flashinfer.topk import top_k_ragged_transform

    R = a.logits.shape[0]
    result = topk_output(a)
    if R == 0:
        return result
    starts, ends = row_bounds(a.row_starts, a.row_ends, a.seq_lens, a.next_n)
    lengths = (ends - starts).clamp_min(0).to(torch.int32)
    offsets = torch.zeros(R, dtype=torch.int32, device=a.logits.device)
    got = top_k_ragged_transform(a.logits.contiguous(), offsets, lengths, a.k,
                                 row_starts=starts.to(torch.int32) if a.row_starts is not None else None)
    return result.copy_(got)
