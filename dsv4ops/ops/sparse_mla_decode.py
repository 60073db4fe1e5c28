"""Op 2 (spec §2, Decision 7): sparse MQA decode over the SWA cache plus an optional extra cache."""
from __future__ import annotations

import torch

from .. import formats
from ..selection import OpCall, call_op, signature_of
from ._validate import Checker
from .qnorm_rope_kv_insert import MAX_HEADS, check_kv_cache

NAME = "sparse_mla_decode"


def validate(q, kv_cache, indices, topk_lens=None, *, layout, block_size, softmax_scale, attn_sink=None,
             extra_kv_cache=None, extra_indices=None, extra_topk_lens=None, extra_block_size=None,
             kv_scale=1.0, q_scale=1.0, out=None, need_lse=True) -> OpCall:
    c = Checker(NAME)
    c.choice("layout", layout, formats.LAYOUTS)
    q_dtype = torch.float8_e4m3fn if layout == "fp8_per_tensor" else torch.bfloat16
    c.tensor("q", q, dtype=q_dtype, shape=("T", "H", formats.HEAD_DIM), anchor=True, contiguous=True)
    T, H = q.shape[0], q.shape[1]
    if not 1 <= H <= MAX_HEADS:
        c.fail("q", f"must have 1 to {MAX_HEADS} heads, got H={H}")
    c.int_arg("block_size", block_size, minimum=1)
    check_kv_cache(c, "kv_cache", kv_cache, layout, block_size)
    _check_index_list(c, "indices", "topk_lens", indices, topk_lens, T, kv_cache.shape[0] * block_size)
    c.float_arg("softmax_scale", softmax_scale, positive=True)
    c.optional("attn_sink", attn_sink, dtype=torch.float32, shape=(H,))
    extras = (extra_indices, extra_topk_lens, extra_block_size)
    if extra_kv_cache is None:
        if any(x is not None for x in extras):
            c.fail("extra_kv_cache", "is required when extra_indices / extra_topk_lens / extra_block_size are given")
    else:
        if extra_indices is None:
            c.fail("extra_indices", "is required with extra_kv_cache")
        c.int_arg("extra_block_size", extra_block_size, minimum=1)
        check_kv_cache(c, "extra_kv_cache", extra_kv_cache, layout, extra_block_size)
        _check_index_list(c, "extra_indices", "extra_topk_lens", extra_indices, extra_topk_lens, T,
                          extra_kv_cache.shape[0] * extra_block_size)
    c.float_arg("kv_scale", kv_scale, positive=True, tensor_ok=True)
    c.float_arg("q_scale", q_scale, positive=True, tensor_ok=True)
    c.out_buffer(out, dtype=torch.bfloat16, shape=(T, H, formats.HEAD_DIM))
    if not isinstance(need_lse, bool):
        c.fail("need_lse", f"must be a bool, got {need_lse!r}")
    kwargs = dict(q=q, kv_cache=kv_cache, indices=indices, topk_lens=topk_lens, layout=layout,
                  block_size=block_size, softmax_scale=softmax_scale, attn_sink=attn_sink,
                  extra_kv_cache=extra_kv_cache, extra_indices=extra_indices, extra_topk_lens=extra_topk_lens,
                  extra_block_size=extra_block_size, kv_scale=kv_scale, q_scale=q_scale, out=out,
                  need_lse=need_lse)
    return OpCall(NAME, kwargs, q.device, signature_of(kwargs))


def _check_index_list(c: Checker, name: str, lens_name: str, indices, lens, T: int, num_slots: int) -> None:
    c.tensor(name, indices, dtype=torch.int32, shape=(T, "topk"), last_dim_contiguous=True)
    c.optional(lens_name, lens, dtype=torch.int32, shape=(T,))
    c.in_range(name, indices, 0, num_slots, allow=-1, what="cache indices (-1 = invalid)")
    c.in_range(lens_name, lens, 0, indices.shape[1] + 1, what="lengths (at most topk)")


def sparse_mla_decode(q, kv_cache, indices, topk_lens=None, *, layout, block_size, softmax_scale,
                      attn_sink=None, extra_kv_cache=None, extra_indices=None, extra_topk_lens=None,
                      extra_block_size=None, kv_scale=1.0, q_scale=1.0, out=None, need_lse=True, backend=None):
    """Sparse MQA decode. q [T, H, 512] (bf16; fp8 for "fp8_per_tensor"), H <= 128; indices int32
    [T, topk] (block * block_size + offset, -1 invalid); topk_lens int32 [T]; attn_sink fp32 [H].
    Returns out bf16 [T, H, 512] and lse fp32 [T, H] (natural log, sink excluded, +inf if lonely);
    with ``need_lse=False`` the second element is None, which admits backends whose kernel does not
    produce the log-sum-exp (FlashInfer's TRTLLM-gen DSV4 decode)."""
    return call_op(validate, dict(q=q, kv_cache=kv_cache, indices=indices, topk_lens=topk_lens, layout=layout,
                                  block_size=block_size, softmax_scale=softmax_scale, attn_sink=attn_sink,
                                  extra_kv_cache=extra_kv_cache, extra_indices=extra_indices,
                                  extra_topk_lens=extra_topk_lens, extra_block_size=extra_block_size,
                                  kv_scale=kv_scale, q_scale=q_scale, out=out, need_lse=need_lse), backend)
