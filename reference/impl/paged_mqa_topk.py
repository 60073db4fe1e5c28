"""Reference for op 12, docs/ops.md §12: literally indexer_topk's reference over paged_mqa_logits'."""
from __future__ import annotations

from dsv4ops import registry

from .indexer_topk import indexer_topk
from .paged_mqa_logits import paged_mqa_logits


def paged_mqa_topk(a):
    logits = paged_mqa_logits(registry.get_op("paged_mqa_logits").Args(
        q=a.q, kv_cache=a.kv_cache, weights=a.weights, context_lens=a.context_lens, block_table=a.block_table,
        max_context_len=a.max_context_len, q_scale=a.q_scale, clean=False, out=None))
    return indexer_topk(registry.get_op("indexer_topk").Args(
        logits=logits, k=a.topk, row_starts=None, row_ends=None, seq_lens=a.context_lens, next_n=a.q.shape[1],
        out=a.out))
