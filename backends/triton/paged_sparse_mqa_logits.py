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


def warmup_calls(dims, limits, machine) -> list[dict]:
    """Warm-up (``dsv4ops.warmup``): the key layouts (``index_layouts``), the lengths' form and the
    clean flag at the model's V4.1 index heads and candidate blocks."""
    blocks = dict(sparse_block=dims.candidate_block, num_blocks=dims.candidate_blocks)
    return [dict(B=1, next_n=limits.next_n, context=2 * limits.c4_block, H=dims.v41_index_heads,
                 block_size=limits.c4_block, layout=lay, lens_dim=d, clean=c, **blocks)
            for lay in limits.index_layouts for d in (1, 2) for c in (False, True)]
