"""Op (docs/ops.md §8): inverse RoPE of the attention output + 1x128 block FP8 quantization, per
o-projection group, producing ``fp8_einsum``'s ``a`` / ``a_scale``."""
from __future__ import annotations

import torch
from torch import Tensor

from .. import formats
from ..opspec import Arg, OpSpec, define
from ..checker import Checker

BLOCK = 128                      # fp8_einsum's activation block


def check(c: Checker, a):
    c.tensor("o", a.o, dtype=torch.bfloat16, shape=("T", "H", formats.HEAD_DIM), anchor=True,
             last_dim_contiguous=True)
    T, H = a.o.shape[0], a.o.shape[1]
    c.tensor("positions", a.positions, dtype=torch.int64, shape=(T,))
    c.tensor("cos_sin_cache", a.cos_sin_cache, dtype=torch.float32, shape=("max_pos", formats.ROPE_DIM),
             contiguous=True)
    c.int_arg("n_groups", a.n_groups, minimum=1)
    if H == 0 or H % a.n_groups:
        c.fail("o", f"must have a positive number of heads divisible by n_groups={a.n_groups}, got H={H}")
    c.in_range("positions", a.positions, 0, a.cos_sin_cache.shape[0], what="positions (rows of cos_sin_cache)")
    return a


def fake(a):
    T, H, D = a.o.shape
    K = H // a.n_groups * D
    return (a.o.new_empty(T, a.n_groups, K, dtype=torch.float8_e4m3fn),
            a.o.new_empty(T, a.n_groups, K // BLOCK, dtype=torch.float32))


SPEC = OpSpec(
    name="inv_rope_fp8_quant",
    doc="""Undo RoPE on dims 448..511 of every head, then quantize per group to FP8 in 1x128 blocks.

    o bf16 [T, H, 512] (last dim contiguous), positions int64 [T], cos_sin_cache fp32 [max_pos, 64],
    n_groups G dividing H. Returns (a float8_e4m3fn [T, G, K], a_scale fp32 [T, G, K/128]) with
    K = H/G * 512: head h is slot h % (H/G) of group h // (H/G); scales are powers of two. These are
    ``fp8_einsum``'s ``a`` and ``a_scale``.""",
    args=(
        Arg("o", Tensor, doc="bf16 [T, H, 512], the attention output"),
        Arg("positions", Tensor, doc="int64 [T]"),
        Arg("cos_sin_cache", Tensor, doc="fp32 [max_pos, 64]"),
        Arg("n_groups", int, keyword_only=True),
    ),
    outputs="(Tensor, Tensor)",
    check=check,
    fake=fake,
)
OP = define(SPEC)
inv_rope_fp8_quant = OP.function
