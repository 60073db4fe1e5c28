"""Op 1 (docs/ops.md §1): Q RMSNorm + RoPE, KV RoPE + quantize + paged insert at ``slot_mapping``."""
from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor

from .. import formats
from ..formats import Layout
from ..opspec import Arg, OpSpec, Scale, define
from ..checker import Checker

MAX_HEADS = 128


def check_layout(c: Checker, layout) -> Layout:
    try:
        return Layout.of(layout)
    except ValueError:
        c.fail("layout", f"must be one of {list(formats.LAYOUTS)}, got {layout!r}")


def check_kv_cache(c: Checker, name: str, cache, layout: Layout, block_size: int) -> None:
    """``cache`` must be what ``formats.allocate_kv_cache(n, block_size, layout)`` returns."""
    if not isinstance(cache, torch.Tensor) or cache.dim() < 1:
        c.fail(name, f"must be a {layout} KV cache tensor, got {type(cache).__name__}")
    shape = layout.cache_shape(cache.shape[0], block_size)
    c.tensor(name, cache, dtype=layout.cache_dtype, shape=("num_blocks",) + shape[1:], contiguous=True)


def check(c: Checker, a):
    c.tensor("q", a.q, dtype=torch.bfloat16, shape=("T", "H", formats.HEAD_DIM), anchor=True, contiguous=True)
    T, H = a.q.shape[0], a.q.shape[1]
    if not 1 <= H <= MAX_HEADS:
        c.fail("q", f"must have 1 to {MAX_HEADS} heads, got H={H}")
    c.tensor("kv", a.kv, dtype=torch.bfloat16, shape=(T, formats.HEAD_DIM), last_dim_contiguous=True)
    c.tensor("positions", a.positions, dtype=torch.int64, shape=(T,))
    c.tensor("cos_sin_cache", a.cos_sin_cache, dtype=torch.float32, shape=("max_pos", formats.ROPE_DIM),
             contiguous=True)
    layout = check_layout(c, a.layout)
    c.int_arg("block_size", a.block_size, minimum=1)
    check_kv_cache(c, "kv_cache", a.kv_cache, layout, a.block_size)
    c.tensor("slot_mapping", a.slot_mapping, dtype=torch.int64, shape=("T'",))
    if a.slot_mapping.shape[0] > T:
        c.fail("slot_mapping", f"must have at most T={T} entries, got {a.slot_mapping.shape[0]}")
    c.float_arg("eps", a.eps, positive=True)
    c.float_arg("kv_scale", a.kv_scale, positive=True, tensor_ok=True)
    c.float_arg("q_scale", a.q_scale, positive=True, tensor_ok=True)
    c.out_buffer(a.out, dtype=layout.query_dtype, shape=(T, H, formats.HEAD_DIM))
    c.disjoint(a, "kv_cache")
    c.disjoint(a, "q", same_ok=("out",))
    c.disjoint(a, "out", same_ok=("q",))
    c.in_range("positions", a.positions, 0, a.cos_sin_cache.shape[0], what="positions (rows of cos_sin_cache)")
    c.in_range("slot_mapping", a.slot_mapping, None, a.kv_cache.shape[0] * a.block_size,
               what="slots (negative = skip)")
    return a._replace(layout=layout)


def fake(a):
    """What the call returns: ``out`` if given, else ``q`` itself, else (fp8_per_tensor) a new fp8 query."""
    if a.out is not None:
        return a.out
    layout = Layout.of(a.layout)
    return a.q if layout.query_dtype == a.q.dtype else a.q.new_empty(a.q.shape, dtype=layout.query_dtype)


SPEC = OpSpec(
    name="qnorm_rope_kv_insert",
    doc="""Normalize + rope Q, rope + quantize KV into ``kv_cache`` at ``slot_mapping`` (-1 = skip).

    q bf16 [T, H, 512], kv bf16 [T, 512] (any row stride), positions int64 [T], cos_sin_cache fp32
    [max_pos, 64], slot_mapping int64 [T'] (T' <= T; positions and slot_mapping: any stride).
    Returns bf16 [T, H, 512] (``q`` itself unless ``out``) for
    "fp8_ds_mla"/"bf16", float8_e4m3fn [T, H, 512] for "fp8_per_tensor" (``q`` unmodified).""",
    args=(
        Arg("q", Tensor, mutated=True, doc="bf16 [T, H, 512], rewritten in place unless out= or fp8_per_tensor"),
        Arg("kv", Tensor, doc="bf16 [T, 512]"),
        Arg("positions", Tensor, doc="int64 [T]"),
        Arg("cos_sin_cache", Tensor, doc="fp32 [max_pos, 64]"),
        Arg("kv_cache", Tensor, mutated=True),
        Arg("slot_mapping", Tensor, doc="int64 [T'], negative = skip"),
        Arg("layout", Layout, keyword_only=True),
        Arg("block_size", int, keyword_only=True),
        Arg("eps", float, 1e-6, keyword_only=True),
        Arg("kv_scale", Scale, 1.0, keyword_only=True),
        Arg("q_scale", Scale, 1.0, keyword_only=True),
        Arg("out", Optional[Tensor], None, keyword_only=True, mutated=True),
    ),
    outputs="Tensor",
    check=check,
    fake=fake,
    out_variant_only=True,
)
OP = define(SPEC)
qnorm_rope_kv_insert = OP.function
