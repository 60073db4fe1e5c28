"""Reference for op 15, docs/ops.md §15: paged_mqa_logits' values at the candidate blocks' positions."""
from __future__ import annotations

from types import SimpleNamespace

import torch

from dsv4ops.reference.impl.paged_mqa_logits import paged_mqa_logits
from dsv4ops.rows import candidate_columns, decode_row_ends


def paged_sparse_mqa_logits(a):
    next_n = a.q.shape[1]
    width = a.block_table.shape[1] * a.kv_cache.shape[1]
    dense = paged_mqa_logits(SimpleNamespace(**{**a._asdict(), "max_context_len": width, "out": None}))   # [R, width]
    pos = candidate_columns(a.blocks, a.sparse_block)
    n = decode_row_ends(a.context_lens, next_n)
    valid = (pos >= 0) & (pos < n[:, None])
    result = torch.where(valid, dense.gather(1, pos.clamp(0, max(width - 1, 0))) if width else 0.0, float("-inf"))
    return result if a.out is None else a.out.copy_(result)
