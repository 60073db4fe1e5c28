"""The composed implementations: each chunk's logits and top-k through the public ops, so dispatch
(tuning table, measured preferences, ``DSV4OPS_BACKEND``, capture) chooses each part's kernel."""
from __future__ import annotations

from dsv4ops import composition, registry


def paged_mqa_topk(a):
    out, answered = composition.paged_output(a)
    if answered:
        return out
    logits, topk = registry.get_op("paged_mqa_logits").function, registry.get_op("indexer_topk").function
    for logits_kw, topk_kw in composition.paged_steps(a, out, composition.DECODE_CHUNK_BYTES):
        topk(logits(**logits_kw), **topk_kw)
    return out


def mqa_topk(a):
    out, answered = composition.prefill_output(a)
    if answered:
        return out
    logits, topk = registry.get_op("mqa_logits").function, registry.get_op("indexer_topk").function
    for logits_kw, topk_kw in composition.prefill_steps(a, out, composition.PREFILL_CHUNK_BYTES):
        topk(logits(**logits_kw), **topk_kw)
    return out
