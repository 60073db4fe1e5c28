"""Triton op 15: the kernel of op 16 (sparse_mqa_logits.py) reading a paged key cache."""
from __future__ import annotations

from dsv4ops import formats

from .sparse_mqa_logits import launch
from .tuning import Target


def paged_sparse_mqa_logits(target: Target, a):
    B, next_n, H, _ = a.q.shape
    mxfp4 = a.kv_cache.shape[-1] == formats.INDEX_MXFP4_TOKEN_BYTES
    return launch(target, a, a.q.view(B * next_n, H, 128), a.kv_cache, a.kv_cache, a.context_lens, a.context_lens,
                  a.block_table, paged=True, mxfp4=mxfp4)
