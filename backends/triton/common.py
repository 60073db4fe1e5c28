"""Triton helpers shared by the kernels: exact UE8M0 exponents, scalar arguments, and the e4m3
arithmetic of both fp8 paths (``Target.fp8_soft``): the FP8 types where the GPU has them, else
integer decode / encode of the OCP e4m3 bytes (no fp8 type), which gives the same values and bytes."""
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
def e4m3_as_f16(byte):
    """OCP e4m3 bytes (uint8, any shape) -> fp16 holding ``value * 2**-8``, exact, in integer
    operations: the sign, exponent and mantissa bits move to fp16's places (bias 7 read as bias 15),
    so e4m3 subnormals land on fp16 subnormals; 0x7F / 0xFF -> NaN."""
    h = (byte.to(tl.int8, bitcast=True).to(tl.int32) << 7) & 0xBF80     # sign-extended: bit 15 = sign
    h = tl.where((h & 0x3F80) == 0x3F80, h | 0x7C00, h)
    return h.to(tl.int16).to(tl.float16, bitcast=True)


@triton.jit
def e4m3_to_f32(byte):
    """OCP e4m3 bytes (uint8) -> fp32, exact (``e4m3_as_f16`` rescaled)."""
    return e4m3_as_f16(byte).to(tl.float32) * 256.0


@triton.jit
def e4m3_encode(x):
    """fp32 -> OCP e4m3 bytes (uint8) in integer operations, the bytes of the hardware conversion
    after saturation (docs/ops.md §0): |x| >= 448 (inf included) -> ±448, round to nearest even,
    NaN -> 0x7F with x's sign."""
    bits = x.to(tl.int32, bitcast=True)
    mag = bits & 0x7FFFFFFF
    # |x| >= 2**-6: exponent rebiased 127 -> 7, mantissa rounded to 3 bits (ties to even; a carry
    # moves into the exponent)
    normal = (mag - (120 << 23) + 0x7FFFF + ((mag >> 20) & 1)) >> 20
    # |x| < 2**-6: 2**14 has the ulp 2**-9 of e4m3 subnormals, so the fp32 sum rounds |x| to them
    subnormal = (tl.abs(x) + 16384.0).to(tl.int32, bitcast=True) - (141 << 23)
    byte = tl.where(mag < (121 << 23), subnormal, tl.where(mag < 0x43E00000, normal, 0x7E))
    byte = tl.where(mag > 0x7F800000, 0x7F, byte)
    return (byte | ((bits >> 24) & 0x80)).to(tl.uint8)


@triton.jit
def to_e4m3(x, FP8_MAX: tl.constexpr, FNUZ: tl.constexpr, SOFT: tl.constexpr):
    """e4m3 of fp32 ``x`` saturated at ±FP8_MAX: the fp8 type (FNUZ or OCP, the hardware conversion),
    or with SOFT the OCP bytes as uint8 (``e4m3_encode``, the same bytes)."""
    if SOFT:
        tl.static_assert(not FNUZ, "the software fp8 path writes OCP e4m3 only")
        y = e4m3_encode(x)
    else:
        fp8: tl.constexpr = tl.float8e4b8 if FNUZ else tl.float8e4nv
        y = tl.clamp(x, -FP8_MAX, FP8_MAX).to(fp8)
    return y


@triton.jit
def load_scalar(ptr_or_value, IS_PTR: tl.constexpr):
    if IS_PTR:
        return tl.load(ptr_or_value).to(tl.float32)
    return ptr_or_value


def fp8_bytes(t: torch.Tensor, soft: bool) -> torch.Tensor:
    """``t`` as the kernels of the path take it: with ``soft`` an e4m3 tensor as its bytes (uint8
    view); every other tensor unchanged."""
    return t.view(torch.uint8) if soft and t.dtype == torch.float8_e4m3fn else t


@triton.jit
def _e4m3_decode_kernel(src, dst, N1, R, stride_s0, stride_s1, BLOCK: tl.constexpr):
    """Row ``program_id(0)`` = i * N1 + j of an e4m3 byte tensor [N0, N1, R] (strides ``stride_s0``,
    ``stride_s1``, 1), K block ``program_id(1)``, into the contiguous fp16 [N0, N1, R] ``dst`` as
    value * 2**-8 (grid: N0 * N1, K blocks)."""
    row = tl.program_id(0).to(tl.int64)
    k = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    ok = k < R
    x = tl.load(src + (row // N1) * stride_s0 + (row % N1) * stride_s1 + k, mask=ok)
    tl.store(dst + row * R + k, e4m3_as_f16(x), mask=ok)


def e4m3_decode(t: torch.Tensor) -> torch.Tensor:
    """e4m3 [N0, N1, R] (last stride 1) -> contiguous fp16 [N0, N1, R] holding value * 2**-8: the
    software fp8 path's one decode per call of an operand that many programs read."""
    N0, N1, R = t.shape
    out = torch.empty(N0, N1, R, dtype=torch.float16, device=t.device)
    if out.numel():
        _e4m3_decode_kernel[(N0 * N1, triton.cdiv(R, 1024))](fp8_bytes(t, True), out, N1, R, t.stride(0),
                                                               t.stride(1), BLOCK=1024)
    return out


def scalar_arg(x) -> tuple[object, bool]:
    """(argument, is_pointer) for a scale given as a float or a 1-element fp32 tensor."""
    if isinstance(x, torch.Tensor):
        return x, True
    return float(x), False
