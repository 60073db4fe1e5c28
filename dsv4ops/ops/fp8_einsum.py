"""Op 4 (docs/ops.md §4): block-scaled FP8 ``bhr,hdr->bhd`` (V4's grouped ``wo_a``)."""
from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor

from ..opspec import Arg, OpSpec, define
from ..checker import Checker

EQUATION = "bhr,hdr->bhd"
BLOCK = 128
OUT_DTYPES = (torch.bfloat16, torch.float32)


def check(c: Checker, a):
    if a.equation != EQUATION:
        c.fail("equation", f"must be {EQUATION!r}, got {a.equation!r}")
    c.tensor("a", a.a, dtype=torch.float8_e4m3fn, shape=("B", "H", "R"), anchor=True, last_dim_contiguous=True)
    B, H, R = a.a.shape
    if R % BLOCK:
        c.fail("a", f"reduction dim R={R} must be a multiple of {BLOCK}")
    c.tensor("b", a.b, dtype=torch.float8_e4m3fn, shape=(H, "D", R), contiguous=True)
    D = a.b.shape[1]
    if D % BLOCK:
        c.fail("b", f"output dim D={D} must be a multiple of {BLOCK}")
    c.tensor("a_scale", a.a_scale, dtype=torch.float32, shape=(B, H, R // BLOCK))
    c.tensor("b_scale", a.b_scale, dtype=torch.float32, shape=(H, D // BLOCK, R // BLOCK))
    c.finite_positive("a_scale", a.a_scale)
    c.finite_positive("b_scale", a.b_scale)
    if a.out_dtype not in OUT_DTYPES:
        c.fail("out_dtype", f"must be one of {[str(d) for d in OUT_DTYPES]}, got {a.out_dtype}")
    if a.out is not None:
        c.tensor("out", a.out, dtype=a.out_dtype, shape=(B, H, D), last_dim_contiguous=True)
        c.disjoint(a, "out")
    return a


def fake(a):
    return a.a.new_empty(a.a.shape[0], a.a.shape[1], a.b.shape[1], dtype=a.out_dtype)


SPEC = OpSpec(
    name="fp8_einsum",
    doc="""``d[b,h,n] = sum_r a[b,h,r] sa[b,h,r//128] * B[h,n,r] sb[h,n//128,r//128]`` in fp32.

    a fp8 [B, H, R] (any batch strides), a_scale fp32 [B, H, R/128] (any strides: MN-major too); b fp8
    [H, D, R], b_scale fp32 [H, D/128, R/128] (any strides); scales finite and > 0. Returns [B, H, D]
    in ``out_dtype`` (bf16 or fp32).""",
    args=(
        Arg("equation", str), Arg("a", Tensor), Arg("a_scale", Tensor), Arg("b", Tensor), Arg("b_scale", Tensor),
        Arg("out", Optional[Tensor], None, keyword_only=True, mutated=True),
        Arg("out_dtype", torch.dtype, torch.bfloat16, keyword_only=True),
    ),
    outputs="Tensor",
    check=check,
    fake=fake,
)
OP = define(SPEC)
fp8_einsum = OP.function
