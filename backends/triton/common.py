"""Triton helpers shared by the kernels: FP8 flavour, exact UE8M0 exponents, scalar arguments."""
from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def ceil_log2(x):
    """Exact ceil(log2(x)) for positive normal fp32 x, from the bits (as the reference does)."""
    bits = x.to(tl.int32, bitcast=True)
    exponent = ((bits >> 23) & 0xFF) - 127
    return exponent + ((bits & 0x7FFFFF) != 0).to(tl.int32)


@triton.jit
def exp2_int(e):
    """2.0 ** e as fp32 for integer e in [-126, 127] (exact)."""
    return ((e + 127) << 23).to(tl.float32, bitcast=True)


@triton.jit
def ue8m0_decode(byte):
    """UE8M0 byte (uint8) -> fp32 2**(byte-127); byte 0 -> 2**-127 (subnormal)."""
    b = byte.to(tl.int32)
    normal = (b << 23).to(tl.float32, bitcast=True)
    return tl.where(b == 0, 5.877471754111438e-39, normal)


@triton.jit
def load_scalar(ptr_or_value, IS_PTR: tl.constexpr):
    if IS_PTR:
        return tl.load(ptr_or_value).to(tl.float32)
    return ptr_or_value


def scalar_arg(x) -> tuple[object, bool]:
    """(argument, is_pointer) for a scale given as a float or a 1-element fp32 tensor."""
    if isinstance(x, torch.Tensor):
        return x, True
    return float(x), False
