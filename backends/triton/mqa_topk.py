"""Triton op 13: mqa_topk as this backend's logits and top-k kernels over chunks of query rows, the
logits of a chunk in one workspace of at most ``WORKSPACE_BYTES`` (or one row, when larger)."""
from __future__ import annotations

import torch

from dsv4ops import registry

from .indexer_topk import indexer_topk
from .mqa_logits import mqa_logits
from .paged_mqa_topk import per_chunk
from .tuning import Target


def mqa_topk(target: Target, a):
    T, S = a.q.shape[0], a.k.shape[0]
    out = torch.empty(T, a.topk, dtype=torch.int32, device=a.q.device) if a.out is None else a.out
    if T == 0:
        return out
    if S == 0:
        return out.fill_(-1)
    chunk = per_chunk(S * 4)                                          # query rows per chunk
    workspace = torch.empty(min(chunk, T), S, dtype=torch.float32, device=a.q.device)
    logits_args, topk_args = registry.get_op("mqa_logits").Args, registry.get_op("indexer_topk").Args
    for t0 in range(0, T, chunk):
        rows = slice(t0, min(T, t0 + chunk))
        n = rows.stop - rows.start
        logits = mqa_logits(target, logits_args(q=a.q[rows], k=a.k, k_scale=a.k_scale, weights=a.weights[rows],
                                                ks=a.ks[rows], ke=a.ke[rows],
                                                q_scale=None if a.q_scale is None else a.q_scale[rows], clean=False,
                                                out=workspace[:n]))
        indexer_topk(target, topk_args(logits=logits, k=a.topk, row_starts=a.ks[rows], row_ends=a.ke[rows],
                                       seq_lens=None, next_n=1, out=out[rows]))
    return out
