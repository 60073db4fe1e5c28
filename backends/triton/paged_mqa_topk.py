"""Triton op 12: paged_mqa_topk as this backend's logits and top-k kernels over chunks of requests,
so the logits never exceed a fixed workspace (``WORKSPACE_BYTES``, or one request's rows when those
are larger) instead of the ``[B * next_n, max_context_len]`` buffer of the two-call composition."""
from __future__ import annotations

import torch

from dsv4ops import registry

from .indexer_topk import indexer_topk
from .paged_mqa_logits import paged_mqa_logits
from .tuning import Target

WORKSPACE_BYTES = 16 << 20


def per_chunk(row_bytes: int) -> int:
    """How many units of ``row_bytes`` logits fit the workspace (at least one)."""
    return max(1, WORKSPACE_BYTES // max(1, row_bytes))


def paged_mqa_topk(target: Target, a):
    B, next_n = a.q.shape[:2]
    out = torch.empty(B * next_n, a.topk, dtype=torch.int32, device=a.q.device) if a.out is None else a.out
    if B == 0:
        return out
    chunk = per_chunk(next_n * a.max_context_len * 4)                 # requests per chunk
    workspace = torch.empty(min(chunk, B) * next_n, a.max_context_len, dtype=torch.float32, device=a.q.device)
    logits_args, topk_args = registry.get_op("paged_mqa_logits").Args, registry.get_op("indexer_topk").Args
    for b0 in range(0, B, chunk):
        b1 = min(B, b0 + chunk)
        rows = slice(b0 * next_n, b1 * next_n)
        logits = paged_mqa_logits(target, logits_args(
            q=a.q[b0:b1], kv_cache=a.kv_cache, weights=a.weights[rows], context_lens=a.context_lens[b0:b1],
            block_table=a.block_table[b0:b1], max_context_len=a.max_context_len,
            q_scale=None if a.q_scale is None else a.q_scale[b0:b1], clean=False,
            out=workspace[: (b1 - b0) * next_n]))
        indexer_topk(target, topk_args(logits=logits, k=a.topk, row_starts=None, row_ends=None,
                                       seq_lens=a.context_lens[b0:b1], next_n=next_n, out=out[rows]))
    return out
