"""Reference for op 3, docs/ops.md §3 "Exact math" (DG ref_fp8_paged_mqa_logits)."""
from __future__ import annotations

import torch

from dsv4ops import formats
from dsv4ops.rows import decode_row_ends


def paged_mqa_logits(a):
    B, next_n, H, _ = a.q.shape
    block_size = a.kv_cache.shape[1]
    keys = formats.unpack_index_keys(a.kv_cache)                           # [num_blocks, block_size, 128]
    q = formats.index_vectors(a.q, a.q_scale)                              # [B, next_n, H, 128] fp32
    limits = decode_row_ends(a.context_lens, next_n).view(B, next_n)       # valid columns per row
    cols = torch.arange(a.max_context_len, device=a.q.device)
    result = torch.full((B, next_n, a.max_context_len), float("-inf"), device=a.q.device)
    for b in range(B):                                                   # one request at a time: bounded memory
        n = int(limits[b].max())
        if n == 0:
            continue
        pages = a.block_table[b, cols[:n] // block_size].to(torch.int64)
        k = keys[pages, cols[:n] % block_size]                           # [n, 128]
        scores = torch.einsum("jhd,cd->jhc", q[b], k).relu()
        logits = torch.einsum("jh,jhc->jc", a.weights[b * next_n:(b + 1) * next_n], scores)
        valid = cols[:n] < limits[b][:, None]
        result[b, :, :n] = torch.where(valid, logits, float("-inf"))
    result = result.view(B * next_n, a.max_context_len)
    return result if a.out is None else a.out.copy_(result)
