"""Op 2 (docs/ops.md §2): sparse MQA decode over the SWA cache plus an optional extra cache."""
from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor

from .. import formats
from ..formats import Layout
from ..opspec import Arg, OpSpec, Scale, define
from ..checker import Checker
from .qnorm_rope_kv_insert import MAX_HEADS, check_kv_cache, check_layout


def check(c: Checker, a):
    layout = check_layout(c, a.layout)
    c.tensor("q", a.q, dtype=layout.query_dtype, shape=("T", "H", formats.HEAD_DIM), anchor=True, contiguous=True)
    T, H = a.q.shape[0], a.q.shape[1]
    if not 1 <= H <= MAX_HEADS:
        c.fail("q", f"must have 1 to {MAX_HEADS} heads, got H={H}")
    c.int_arg("block_size", a.block_size, minimum=1)
    check_kv_cache(c, "kv_cache", a.kv_cache, layout, a.block_size)
    _check_index_list(c, "indices", "topk_lens", a.indices, a.topk_lens, T, a.kv_cache.shape[0] * a.block_size)
    c.float_arg("softmax_scale", a.softmax_scale, positive=True)
    c.optional("attn_sink", a.attn_sink, dtype=torch.float32, shape=(H,))
    c.not_nan("attn_sink", a.attn_sink)
    if a.extra_kv_cache is None:
        if any(x is not None for x in (a.extra_indices, a.extra_topk_lens, a.extra_block_size)):
            c.fail("extra_kv_cache", "is required when extra_indices / extra_topk_lens / extra_block_size are given")
    else:
        if a.extra_indices is None:
            c.fail("extra_indices", "is required with extra_kv_cache")
        c.int_arg("extra_block_size", a.extra_block_size, minimum=1)
        check_kv_cache(c, "extra_kv_cache", a.extra_kv_cache, layout, a.extra_block_size)
        _check_index_list(c, "extra_indices", "extra_topk_lens", a.extra_indices, a.extra_topk_lens, T,
                          a.extra_kv_cache.shape[0] * a.extra_block_size)
    c.float_arg("kv_scale", a.kv_scale, positive=True, tensor_ok=True)
    c.float_arg("q_scale", a.q_scale, positive=True, tensor_ok=True)
    c.out_buffer(a.out, dtype=torch.bfloat16, shape=(T, H, formats.HEAD_DIM))
    c.bool_arg("need_lse", a.need_lse)
    c.disjoint(a, "out")
    c.disjoint(a, "kv_cache", others=("q",))
    c.disjoint(a, "extra_kv_cache", others=("q",))
    return a._replace(layout=layout)


def _check_index_list(c: Checker, name: str, lens_name: str, indices, lens, T: int, num_slots: int) -> None:
    c.tensor(name, indices, dtype=torch.int32, shape=(T, "topk"))
    c.optional(lens_name, lens, dtype=torch.int32, shape=(T,))
    c.in_range(name, indices, 0, num_slots, allow=-1, what="cache indices (-1 = invalid)")
    c.in_range(lens_name, lens, 0, indices.shape[1] + 1, what="lengths (at most topk)")


def fake(a):
    T, H, D = a.q.shape
    out = a.q.new_empty(T, H, D, dtype=torch.bfloat16)
    return out, a.q.new_empty(T, H, dtype=torch.float32) if a.need_lse else None


SPEC = OpSpec(
    name="sparse_mla_decode",
    doc="""Sparse MQA decode. q [T, H, 512] (bf16; fp8 for "fp8_per_tensor"), H <= 128; indices int32
    [T, topk] (block * block_size + offset, -1 invalid); topk_lens int32 [T]; attn_sink fp32 [H].
    Returns out bf16 [T, H, 512] and lse fp32 [T, H] (natural log, sink excluded, +inf if lonely);
    with ``need_lse=False`` the second element is None, which admits backends whose kernel does not
    produce the log-sum-exp (FlashInfer's TRTLLM-gen DSV4 decode).""",
    args=(
        Arg("q", Tensor, doc="bf16 [T, H, 512] (fp8 for fp8_per_tensor)"),
        Arg("kv_cache", Tensor, doc="the SWA cache in `layout`"),
        Arg("indices", Tensor, doc="int32 [T, topk] cache slots, -1 invalid"),
        Arg("topk_lens", Optional[Tensor], None, doc="int32 [T] valid prefix of each index row"),
        Arg("layout", Layout, keyword_only=True),
        Arg("block_size", int, keyword_only=True),
        Arg("softmax_scale", float, keyword_only=True),
        Arg("attn_sink", Optional[Tensor], None, keyword_only=True, doc="fp32 [H]"),
        Arg("extra_kv_cache", Optional[Tensor], None, keyword_only=True, doc="the compressed cache"),
        Arg("extra_indices", Optional[Tensor], None, keyword_only=True),
        Arg("extra_topk_lens", Optional[Tensor], None, keyword_only=True),
        Arg("extra_block_size", Optional[int], None, keyword_only=True),
        Arg("kv_scale", Scale, 1.0, keyword_only=True),
        Arg("q_scale", Scale, 1.0, keyword_only=True),
        Arg("out", Optional[Tensor], None, keyword_only=True, mutated=True, doc="bf16 [T, H, 512]"),
        Arg("need_lse", bool, True, keyword_only=True),
    ),
    outputs="(Tensor, Tensor?)",
    check=check,
    fake=fake,
)
OP = define(SPEC)
sparse_mla_decode = OP.function
