"""The composed implementations: each chunk's logits and top-k through the public ops, so dispatch
(tuning table, measured preferences, ``DSV4OPS_BACKEND``, capture) chooses each part's kernel."""
from __future__ import annotations

import torch

from dsv4ops import composition, registry


def paged_mqa_topk(a):
    B, next_n = a.q.shape[:2]
    out = torch.empty(B * next_n, a.topk, dtype=torch.int32, device=a.q.device) if a.out is None else a.out
    if B == 0:
        return out
    logits, topk = registry.get_op("paged_mqa_logits").function, registry.get_op("indexer_topk").function
    for logits_kw, topk_kw in composition.paged_steps(a, out, composition.DECODE_CHUNK_BYTES):
        topk(logits(**logits_kw), **topk_kw)
    return out


def mqa_topk(a):
    T = a.q.shape[0]
    out = torch.empty(T, a.topk, dtype=torch.int32, device=a.q.device) if a.out is None else a.out
    if T == 0:
        return out
    if a.k.shape[0] == 0:
        return out.fill_(-1)
    logits, topk = registry.get_op("mqa_logits").function, registry.get_op("indexer_topk").function
    for logits_kw, topk_kw in composition.prefill_steps(a, out, composition.PREFILL_CHUNK_BYTES):
        topk(logits(**logits_kw), **topk_kw)
    return out
