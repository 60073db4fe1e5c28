"""Op 3 (docs/ops.md §3): lightning-indexer weighted-ReLU MQA logits over a paged FP8 key cache."""
from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor

from .. import formats
from ..opspec import Arg, OpSpec, define
from ..checker import Checker


def check(c: Checker, a):
    c.tensor("q", a.q, dtype=torch.float8_e4m3fn, shape=("B", "next_n", "H", formats.INDEX_DIM), anchor=True,
             contiguous=True)
    B, next_n, H = a.q.shape[:3]
    c.tensor("kv_cache", a.kv_cache, dtype=torch.uint8,
             shape=("num_blocks", "block_size", 1, formats.INDEX_TOKEN_BYTES), contiguous=True)
    if a.kv_cache.shape[1] < 1:
        c.fail("kv_cache", f"must have block_size (dim 1) >= 1, got {list(a.kv_cache.shape)}")
    c.tensor("weights", a.weights, dtype=torch.float32, shape=(B * next_n, H))
    lens = a.context_lens
    if not isinstance(lens, torch.Tensor) or lens.dim() not in (1, 2):
        c.fail("context_lens", f"must be int32 [B={B}] or [B={B}, next_n={next_n}]")
    c.tensor("context_lens", lens, dtype=torch.int32, shape=(B,) if lens.dim() == 1 else (B, next_n))
    c.tensor("block_table", a.block_table, dtype=torch.int32, shape=(B, "max_blocks"))
    c.int_arg("max_context_len", a.max_context_len, minimum=0)
    c.size_limit("max_context_len", a.max_context_len)
    c.bool_arg("clean", a.clean)
    c.out_buffer(a.out, dtype=torch.float32, shape=(B * next_n, a.max_context_len))
    c.disjoint(a, "out")
    block_size = a.kv_cache.shape[1]
    limit = min(a.max_context_len, a.block_table.shape[1] * block_size)
    c.in_range("context_lens", lens, 0, limit + 1,
               what=f"lengths (at most max_context_len and max_blocks * block_size = {limit})")
    if c.values_checked(a.block_table) and B:
        pages_needed = (lens.reshape(B, -1).amax(1).to(torch.int64) + block_size - 1) // block_size
        used = torch.arange(a.block_table.shape[1], device=a.block_table.device) < pages_needed[:, None]
        c.in_range("block_table", a.block_table[used], 0, a.kv_cache.shape[0], what="block ids of used pages")
    return a


def fake(a):
    return a.q.new_empty(a.q.shape[0] * a.q.shape[1], a.max_context_len, dtype=torch.float32)


SPEC = OpSpec(
    name="paged_mqa_logits",
    doc="""q fp8 [B, next_n, H, 128]; kv_cache uint8 [num_blocks, block_size, 1, 132]; weights fp32
    [B * next_n, H]; context_lens int32 [B] (causal MTP rule) or [B, next_n]; block_table int32
    [B, max_blocks] (weights, context_lens and block_table: any strides). Returns fp32
    [B * next_n, max_context_len]; columns past a row's length are unspecified, or exactly -inf with
    ``clean=True``.""",
    args=(
        Arg("q", Tensor), Arg("kv_cache", Tensor), Arg("weights", Tensor), Arg("context_lens", Tensor),
        Arg("block_table", Tensor), Arg("max_context_len", int),
        Arg("clean", bool, False, keyword_only=True),
        Arg("out", Optional[Tensor], None, keyword_only=True, mutated=True),
    ),
    outputs="Tensor",
    check=check,
    fake=fake,
)
OP = define(SPEC)
paged_mqa_logits = OP.function
