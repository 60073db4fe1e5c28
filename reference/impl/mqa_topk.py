"""Reference for op 13, docs/ops.md §13: literally indexer_topk's reference over mqa_logits'."""
from __future__ import annotations

from dsv4ops import registry

from .indexer_topk import indexer_topk
from .mqa_logits import mqa_logits


def mqa_topk(a):
    logits = mqa_logits(registry.get_op("mqa_logits").Args(
        q=a.q, k=a.k, k_scale=a.k_scale, weights=a.weights, ks=a.ks, ke=a.ke, q_scale=a.q_scale, clean=False,
        out=None))
    return indexer_topk(registry.get_op("indexer_topk").Args(
        logits=logits, k=a.topk, row_starts=a.ks, row_ends=a.ke, seq_lens=None, next_n=1, out=a.out))
