"""The five ops as PyTorch custom ops, ``torch.ops.dsv4ops.<op>``, for torch.compile and graphs.

Each custom op declares what it mutates and has a fake (meta) implementation, so
``torch.compile(fullgraph=True)`` traces through it; its real implementation is the public
``dsv4ops.<op>`` (validation + cached backend selection), which runs at call time outside the
traced graph. Differences from the Python API, forced by the custom-op rules (outputs may not
alias inputs): ``qnorm_rope_kv_insert`` writes its result into a required ``out`` buffer (pass
``q`` itself for the in-place layouts) and returns nothing; scales are Python floats; the other
ops allocate their outputs. Importing this module registers the ops.
"""
from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor

from . import ops

LIB = "dsv4ops"


@torch.library.custom_op(f"{LIB}::qnorm_rope_kv_insert", mutates_args=("kv_cache", "out"))
def qnorm_rope_kv_insert(q: Tensor, kv: Tensor, positions: Tensor, cos_sin_cache: Tensor, kv_cache: Tensor,
                         slot_mapping: Tensor, out: Tensor, layout: str, block_size: int, eps: float = 1e-6,
                         kv_scale: float = 1.0, q_scale: float = 1.0) -> None:
    ops.qnorm_rope_kv_insert(q, kv, positions, cos_sin_cache, kv_cache,
                             slot_mapping, layout=layout, block_size=block_size, eps=eps, kv_scale=kv_scale,
                             q_scale=q_scale, out=out)


@qnorm_rope_kv_insert.register_fake
def _(q, kv, positions, cos_sin_cache, kv_cache, slot_mapping, out, layout, block_size, eps=1e-6, kv_scale=1.0,
      q_scale=1.0):
    return None


@torch.library.custom_op(f"{LIB}::sparse_mla_decode", mutates_args=())
def sparse_mla_decode(q: Tensor, kv_cache: Tensor, indices: Tensor, topk_lens: Optional[Tensor], layout: str,
                      block_size: int, softmax_scale: float, attn_sink: Optional[Tensor] = None,
                      extra_kv_cache: Optional[Tensor] = None, extra_indices: Optional[Tensor] = None,
                      extra_topk_lens: Optional[Tensor] = None, extra_block_size: Optional[int] = None,
                      kv_scale: float = 1.0, q_scale: float = 1.0) -> tuple[Tensor, Tensor]:
    return ops.sparse_mla_decode(q, kv_cache, indices, topk_lens, layout=layout, block_size=block_size,
                                 softmax_scale=softmax_scale, attn_sink=attn_sink, extra_kv_cache=extra_kv_cache,
                                 extra_indices=extra_indices, extra_topk_lens=extra_topk_lens,
                                 extra_block_size=extra_block_size, kv_scale=kv_scale, q_scale=q_scale)


@sparse_mla_decode.register_fake
def _(q, kv_cache, indices, topk_lens, layout, block_size, softmax_scale, attn_sink=None, extra_kv_cache=None,
      extra_indices=None, extra_topk_lens=None, extra_block_size=None, kv_scale=1.0, q_scale=1.0):
    T, H, D = q.shape
    return q.new_empty(T, H, D, dtype=torch.bfloat16), q.new_empty(T, H, dtype=torch.float32)


@torch.library.custom_op(f"{LIB}::paged_mqa_logits", mutates_args=())
def paged_mqa_logits(q: Tensor, kv_cache: Tensor, weights: Tensor, context_lens: Tensor, block_table: Tensor,
                     max_context_len: int, clean: bool = False) -> Tensor:
    return ops.paged_mqa_logits(q, kv_cache, weights, context_lens, block_table, max_context_len, clean=clean)


@paged_mqa_logits.register_fake
def _(q, kv_cache, weights, context_lens, block_table, max_context_len, clean=False):
    return q.new_empty(q.shape[0] * q.shape[1], max_context_len, dtype=torch.float32)


@torch.library.custom_op(f"{LIB}::fp8_einsum", mutates_args=())
def fp8_einsum(equation: str, a: Tensor, a_scale: Tensor, b: Tensor, b_scale: Tensor,
               out_dtype: torch.dtype = torch.bfloat16) -> Tensor:
    return ops.fp8_einsum(equation, a, a_scale, b, b_scale, out_dtype=out_dtype)


@fp8_einsum.register_fake
def _(equation, a, a_scale, b, b_scale, out_dtype=torch.bfloat16):
    return a.new_empty(a.shape[0], a.shape[1], b.shape[1], dtype=out_dtype)


@torch.library.custom_op(f"{LIB}::indexer_topk", mutates_args=())
def indexer_topk(logits: Tensor, k: int, row_starts: Optional[Tensor] = None, row_ends: Optional[Tensor] = None,
                 seq_lens: Optional[Tensor] = None, next_n: int = 1) -> Tensor:
    return ops.indexer_topk(logits, k, row_starts=row_starts, row_ends=row_ends, seq_lens=seq_lens, next_n=next_n)


@indexer_topk.register_fake
def _(logits, k, row_starts=None, row_ends=None, seq_lens=None, next_n=1):
    return logits.new_empty(logits.shape[0], k, dtype=torch.int32)
