"""Reference for op 15, docs/ops.md §15: §3's weighted-ReLU logits at the candidate blocks' keys."""
from __future__ import annotations

import torch

from dsv4ops import formats
from dsv4ops.reference.impl.sparse_mqa_logits import candidate_logits
from dsv4ops.rows import candidate_columns, decode_row_ends


def paged_sparse_mqa_logits(a):
    B, next_n, H, _ = a.q.shape
    block_size = a.kv_cache.shape[1]
    keys = formats.unpack_index_keys(a.kv_cache)                           # [num_pages, block_size, 128]
    pos = candidate_columns(a.blocks, a.sparse_block)
    valid = (pos >= 0) & (pos < decode_row_ends(a.context_lens, next_n)[:, None])
    pos = torch.where(valid, pos, 0)
    req = torch.arange(B * next_n, device=pos.device) // next_n

    def keys_of(rows, live):
        p = pos[rows]
        pages = a.block_table[req[rows, None], p // block_size].to(torch.int64)
        return torch.where(live[..., None], keys[pages, p % block_size], 0.0)

    result = candidate_logits(a.q.to(torch.float32).view(B * next_n, H, a.q.shape[3]), a.weights, valid, keys_of)
    return result if a.out is None else a.out.copy_(result)
