"""Reference for op 16, docs/ops.md §16: mqa_logits' values at the candidate blocks' positions."""
from __future__ import annotations

import torch

from dsv4ops.reference.impl.mqa_logits import mqa_logits
from dsv4ops.rows import candidate_columns


def sparse_mqa_logits(a):
    S = a.k.shape[0]
    dense = mqa_logits(a._replace(out=None))                             # [T, S]
    pos = candidate_columns(a.blocks, a.sparse_block)
    ks, n = a.ks.to(torch.int64)[:, None], (a.ke - a.ks).to(torch.int64)[:, None]
    valid = (pos >= 0) & (pos < n)
    result = torch.where(valid, dense.gather(1, (ks + pos).clamp(0, max(S - 1, 0))) if S else 0.0, float("-inf"))
    return result if a.out is None else a.out.copy_(result)
