"""Op 4 (spec §4, Decision 5): block-scaled FP8 ``bhr,hdr->bhd`` (V4's grouped ``wo_a``)."""
from __future__ import annotations

import torch

from ..selection import OpCall, call_op, signature_of
from ._validate import Checker

NAME = "fp8_einsum"
EQUATION = "bhr,hdr->bhd"
BLOCK = 128
OUT_DTYPES = (torch.bfloat16, torch.float32)


def validate(equation, a, a_scale, b, b_scale, *, out=None, out_dtype=torch.bfloat16) -> OpCall:
    c = Checker(NAME)
    if equation != EQUATION:
        c.fail("equation", f"must be {EQUATION!r}, got {equation!r}")
    c.tensor("a", a, dtype=torch.float8_e4m3fn, shape=("B", "H", "R"), anchor=True, last_dim_contiguous=True)
    B, H, R = a.shape
    if R % BLOCK:
        c.fail("a", f"reduction dim R={R} must be a multiple of {BLOCK}")
    c.tensor("b", b, dtype=torch.float8_e4m3fn, shape=(H, "D", R), contiguous=True)
    D = b.shape[1]
    if D % BLOCK:
        c.fail("b", f"output dim D={D} must be a multiple of {BLOCK}")
    c.tensor("a_scale", a_scale, dtype=torch.float32, shape=(B, H, R // BLOCK))
    c.tensor("b_scale", b_scale, dtype=torch.float32, shape=(H, D // BLOCK, R // BLOCK))
    if out_dtype not in OUT_DTYPES:
        c.fail("out_dtype", f"must be one of {[str(d) for d in OUT_DTYPES]}, got {out_dtype}")
    if out is not None:
        c.tensor("out", out, dtype=out_dtype, shape=(B, H, D), last_dim_contiguous=True)
    kwargs = dict(equation=equation, a=a, a_scale=a_scale, b=b, b_scale=b_scale, out=out, out_dtype=out_dtype)
    return OpCall(NAME, kwargs, a.device, signature_of(kwargs))


def fp8_einsum(equation, a, a_scale, b, b_scale, *, out=None, out_dtype=torch.bfloat16, backend=None):
    """``d[b,h,n] = sum_r a[b,h,r] sa[b,h,r//128] * B[h,n,r] sb[h,n//128,r//128]`` in fp32.

    a fp8 [B, H, R] (any batch strides), a_scale fp32 [B, H, R/128]; b fp8 [H, D, R],
    b_scale fp32 [H, D/128, R/128]. Returns [B, H, D] in ``out_dtype`` (bf16 or fp32)."""
    return call_op(validate, dict(equation=equation, a=a, a_scale=a_scale, b=b, b_scale=b_scale, out=out,
                                  out_dtype=out_dtype), backend)
