"""Op 3 (spec §3, Decision 8): lightning-indexer weighted-ReLU MQA logits over a paged FP8 key cache."""
from __future__ import annotations

import torch

from .. import formats
from ..selection import OpCall, call_op, signature_of
from ._validate import Checker

NAME = "paged_mqa_logits"


def validate(q, kv_cache, weights, context_lens, block_table, max_context_len, *, clean=False,
             out=None) -> OpCall:
    c = Checker(NAME)
    c.tensor("q", q, dtype=torch.float8_e4m3fn, shape=("B", "next_n", "H", formats.INDEX_DIM), anchor=True,
             contiguous=True)
    B, next_n, H = q.shape[:3]
    c.tensor("kv_cache", kv_cache, dtype=torch.uint8, shape=("num_blocks", "block_size", 1, formats.INDEX_TOKEN_BYTES),
             contiguous=True)
    c.tensor("weights", weights, dtype=torch.float32, shape=(B * next_n, H), last_dim_contiguous=True)
    if not isinstance(context_lens, torch.Tensor) or context_lens.dim() not in (1, 2):
        c.fail("context_lens", f"must be int32 [B={B}] or [B={B}, next_n={next_n}]")
    c.tensor("context_lens", context_lens, dtype=torch.int32,
             shape=(B,) if context_lens.dim() == 1 else (B, next_n))
    c.tensor("block_table", block_table, dtype=torch.int32, shape=(B, "max_blocks"), last_dim_contiguous=True)
    c.int_arg("max_context_len", max_context_len, minimum=0)
    if not isinstance(clean, bool):
        c.fail("clean", f"must be a bool, got {clean!r}")
    c.out_buffer(out, dtype=torch.float32, shape=(B * next_n, max_context_len))
    block_size = kv_cache.shape[1]
    limit = min(max_context_len, block_table.shape[1] * block_size)
    c.in_range("context_lens", context_lens, 0, limit + 1,
               what=f"lengths (at most max_context_len and max_blocks * block_size = {limit})")
    if c.values_checked(block_table) and B:
        pages_needed = (context_lens.reshape(B, -1).amax(1).to(torch.int64) + block_size - 1) // block_size
        used = torch.arange(block_table.shape[1], device=block_table.device) < pages_needed[:, None]
        c.in_range("block_table", block_table[used], 0, kv_cache.shape[0], what="block ids of used pages")
    kwargs = dict(q=q, kv_cache=kv_cache, weights=weights, context_lens=context_lens, block_table=block_table,
                  max_context_len=max_context_len, clean=clean, out=out)
    return OpCall(NAME, kwargs, q.device, signature_of(kwargs))


def paged_mqa_logits(q, kv_cache, weights, context_lens, block_table, max_context_len, *, clean=False,
                     out=None, backend=None):
    """q fp8 [B, next_n, H, 128]; kv_cache uint8 [num_blocks, block_size, 1, 132]; weights fp32
    [B * next_n, H]; context_lens int32 [B] (causal MTP rule) or [B, next_n]; block_table int32
    [B, max_blocks]. Returns fp32 [B * next_n, max_context_len]; columns past a row's length are
    unspecified, or exactly -inf with ``clean=True``."""
    return call_op(validate, dict(q=q, kv_cache=kv_cache, weights=weights, context_lens=context_lens,
                                  block_table=block_table, max_context_len=max_context_len, clean=clean, out=out),
                   backend)
