"""Triton helpers shared by the kernels: exact UE8M0 exponents, scalar arguments, the e4m3
arithmetic of both fp8 paths (``Target.fp8_soft``): the FP8 types where the GPU has them, else
integer decode / encode of the OCP e4m3 bytes (no fp8 type), which gives the same values and bytes;
and programmatic dependent launch (``Target.pdl``)."""
from __future__ import annotations

import torch
import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait


@triton.jit
def let_dependents_launch(PDL: tl.constexpr):
    """With PDL, the stream's next kernel, if launched with ``pdl_launch``, may start now."""
    if PDL:
        gdc_launch_dependents()


@triton.jit
def wait_for_prior_grid(PDL: tl.constexpr):
    """With PDL, wait until the previous kernel of the stream has ended and its writes are visible
    (a kernel launched with ``pdl_launch`` reads nothing that kernel writes before this)."""
    if PDL:
        gdc_wait()


def pdl_launch(pdl: bool) -> dict:
    """The launch options of a kernel that may start before the previous one ends."""
    return {"launch_pdl": True} if pdl else {}


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
def fp8_byte(y, SOFT: tl.constexpr):
    """The uint8 byte of an e4m3 value from ``to_e4m3`` (the fp8 type bitcast, or already the byte)."""
    if SOFT:
        return y
    return y.to(tl.uint8, bitcast=True)


@triton.jit
def e4m3_byte_to_f32(byte, SOFT: tl.constexpr):
    """OCP e4m3 bytes (uint8) -> fp32: the fp8 type's conversion, or with SOFT ``e4m3_to_f32``.
    One return after both branches: Triton's code generator also visits what follows a return inside
    a constexpr branch, and the fp8 type does not exist on sm80."""
    if SOFT:
        y = e4m3_to_f32(byte)
    else:
        y = byte.to(tl.float8e4nv, bitcast=True).to(tl.float32)
    return y


# DeepSeek-V4.1 token records (docs/ops.md §6.6): a row of 512 values is a tile [R, 512]; MXFP8 has
# one UE8M0 byte per 32 values, NVFP4 packs two e2m1 codes a byte and one e4m3 byte per 16 values.

@triton.jit
def v41_record_offsets(slot, block_size, TOKEN_BYTES: tl.constexpr, DATA_BYTES: tl.constexpr,
                       INLINE: tl.constexpr):
    """Byte offsets in its page of the values and of the scales of the token in page slot ``slot``:
    inline pages hold records back to back, split pages ``block_size`` value rows then the scale rows."""
    if INLINE:
        data = slot * TOKEN_BYTES
        scales = data + DATA_BYTES
    else:
        data = slot * DATA_BYTES
        scales = block_size * DATA_BYTES + slot * (TOKEN_BYTES - DATA_BYTES)
    return data, scales


@triton.jit
def mxfp8_decode(values, scales, R: tl.constexpr, SOFT: tl.constexpr):
    """MXFP8 record -> fp32 ``[R, 512]``: e4m3 bytes (uint8 ``[R, 512]``) times ``2**(byte - 127)``
    of their UE8M0 byte (uint8 ``[R, 16]``, one per 32 values; 255 -> NaN)."""
    v = tl.reshape(e4m3_byte_to_f32(values, SOFT), (R, 16, 32))
    s = tl.where(scales == 255, float("nan"), ue8m0_decode(scales))
    return tl.reshape(v * s[:, :, None], (R, 512))


@triton.jit
def mxfp8_encode(x, R: tl.constexpr, SOFT: tl.constexpr):
    """fp32 ``[R, 512]`` -> (e4m3 bytes uint8 ``[R, 512]``, UE8M0 bytes uint8 ``[R, 16]``), the
    bytes of ``quant.encode_mxfp8``: per 32 values ``e = ceil(log2(max(amax / 448, 1e-4)))``, values
    ``sat_e4m3(x / 2**e)`` RNE; a block holding NaN or inf gets byte 255 and NaN values (0x7F)."""
    blocks = tl.reshape(x, (R, 16, 32))
    amax = tl.max(tl.abs(blocks), axis=2)
    special = (tl.max((blocks != blocks).to(tl.int32), axis=2) > 0) | (amax == float("inf"))
    quotient = tl.math.div_rn(amax, 448.0)
    quotient = tl.where(quotient < 1e-4, 1e-4, quotient)
    e = tl.minimum(ceil_log2(quotient), 127)            # 1e-4 floor: e >= -13; amax finite: e <= 120
    byte = tl.where(special, 255, e + 127)
    y = fp8_byte(to_e4m3(blocks * exp2_int(-e)[:, :, None], 448.0, False, SOFT), SOFT)
    y = tl.where(special[:, :, None], 0x7F, y).to(tl.uint8)
    return tl.reshape(y, (R, 512)), byte.to(tl.uint8)


@triton.jit
def e2m1_as_e4m3(code):
    """4-bit e2m1 codes (low nibble of a uint8 tile) -> the e4m3 bytes of ``value * 2**-6``, exactly:
    the exponent and mantissa bits land in e4m3's low exponent and top mantissa bits (exponent
    field 0, e2m1's 0 / 0.5, becomes e4m3's subnormal 0 / 2**-7), bit 3 the sign."""
    return ((code & 8) << 4) | ((code & 7) << 2)


@triton.jit
def e2m1_encode(x):
    """fp32 -> e2m1 codes (int32, 0..15): round to nearest even, saturating at ±6, the sign bit kept
    for -0 and negatives that round to 0, NaN -> 0 (as ``quant.e2m1_code``)."""
    nan = x != x
    m = tl.where(nan, 0.0, tl.abs(x))
    code = ((m > 0.25).to(tl.int32) + (m >= 0.75).to(tl.int32) + (m > 1.25).to(tl.int32)
            + (m >= 1.75).to(tl.int32) + (m > 2.5).to(tl.int32) + (m >= 3.5).to(tl.int32)
            + (m > 5.0).to(tl.int32))
    sign = tl.where(nan, 0, (x.to(tl.int32, bitcast=True) >> 28) & 8)
    return code | sign


@triton.jit
def nvfp4_decode(packed, scales, R: tl.constexpr, SOFT: tl.constexpr):
    """NVFP4 record -> fp32 ``[R, 512]``: packed e2m1 (uint8 ``[R, 256]``, value 2i in the low nibble
    of byte i) times the e4m3 scale (uint8 ``[R, 32]``, one per 16 values)."""
    codes = tl.reshape(tl.join(e2m1_as_e4m3(packed & 0xF), e2m1_as_e4m3(packed >> 4)), (R, 32, 16))
    v = e4m3_byte_to_f32(codes, SOFT)                       # value * 2**-6, through the fp8 conversion
    return tl.reshape(v * (e4m3_byte_to_f32(scales, SOFT) * 64.0)[:, :, None], (R, 512))


@triton.jit
def nvfp4_encode(x, R: tl.constexpr, SOFT: tl.constexpr):
    """fp32 ``[R, 512]`` -> (packed e2m1 uint8 ``[R, 256]``, e4m3 scale bytes uint8 ``[R, 32]``), the
    bytes of ``quant.encode_nvfp4``: per 16 values scale ``e4m3_RNE(clamp(amax / 6, 2**-9, 448))``,
    codes ``e2m1(x / scale)`` (IEEE division); a NaN block gets scale byte 0x7F and codes 0."""
    blocks = tl.reshape(x, (R, 32, 16))
    amax = tl.max(tl.abs(blocks), axis=2)
    nan = tl.max((blocks != blocks).to(tl.int32), axis=2) > 0
    s = tl.minimum(tl.maximum(tl.math.div_rn(tl.where(nan, 0.0, amax), 6.0), 0.001953125), 448.0)
    byte = fp8_byte(to_e4m3(s, 448.0, False, SOFT), SOFT)
    codes = e2m1_encode(tl.math.div_rn(blocks, e4m3_byte_to_f32(byte, SOFT)[:, :, None]))
    codes = tl.where(nan[:, :, None], 0, codes)
    return e2m1_pack(codes, R, 512), tl.where(nan, 0x7F, byte).to(tl.uint8)


@triton.jit
def e2m1_pack(codes, R: tl.constexpr, D: tl.constexpr):
    """e2m1 codes (int32, ``D`` a row in any blocking ``[R, ...]``) -> uint8 ``[R, D / 2]``, value
    ``2i`` in the low nibble of byte ``i``."""
    lo, hi = tl.split(tl.reshape(codes, (R, D // 2, 2)))
    return (lo | (hi << 4)).to(tl.uint8)


@triton.jit
def mxfp4_encode(x, R: tl.constexpr, D: tl.constexpr):
    """fp32 ``[R, D]`` -> (packed e2m1 uint8 ``[R, D / 2]``, UE8M0 bytes uint8 ``[R, D / 32]``), the
    bytes of ``quant.encode_mxfp4``: per 32 values ``e = max(ceil(log2(amax / 6)), -126)`` (IEEE
    quotient, exact exponent), codes ``e2m1(x / 2**e)``; a block holding NaN or inf gets byte 255 and
    codes 0."""
    blocks = tl.reshape(x, (R, D // 32, 32))
    amax = tl.max(tl.abs(blocks), axis=2)
    bad = (tl.max((blocks != blocks).to(tl.int32), axis=2) > 0) | (amax == float("inf"))
    quotient = tl.math.div_rn(tl.where(bad, 1.0, amax), 6.0)
    e = ceil_log2(tl.maximum(quotient, 1.1754943508222875e-38))          # floor 2**-126: e >= -126
    codes = tl.where(bad[:, :, None], 0, e2m1_encode(blocks * exp2_int(-e)[:, :, None]))
    return e2m1_pack(codes, R, D), tl.where(bad, 255, e + 127).to(tl.uint8)


@triton.jit
def mxfp4_decode(packed, scales, R: tl.constexpr, D: tl.constexpr):
    """MXFP4 rows -> fp32 ``[R, D]``: packed e2m1 (uint8 ``[R, D / 2]``, value 2i in the low nibble of
    byte i) times ``2**(byte - 127)`` of their UE8M0 byte (uint8 ``[R, D / 32]``; 255 -> NaN), the
    values of ``quant.decode_mxfp4``."""
    codes = tl.join(e2m1_as_e4m3(packed & 0xF), e2m1_as_e4m3(packed >> 4))
    v = tl.reshape(e4m3_to_f32(codes) * 64.0, (R, D // 32, 32))          # e2m1 exactly (value * 2**-6 read back)
    s = tl.where(scales == 255, float("nan"), ue8m0_decode(scales))
    return tl.reshape(v * s[:, :, None], (R, D))


@triton.jit
def index_mxfp4_keys(cache_ptr, page, slot, live, block_size, page_stride, R: tl.constexpr):
    """Keys of an ``index_mxfp4`` cache (docs/ops.md §6.4.1) -> fp32 ``[R, 128]``: row i is token
    ``slot[i]`` of page ``page[i]`` (int64 ``[R]``; pages ``page_stride`` bytes apart, each ``block_size``
    64 B value rows then ``block_size`` 4 B UE8M0 rows); rows where ``live`` is False read as 0."""
    base = cache_ptr + page * page_stride
    packed = tl.load((base + slot * 64)[:, None] + tl.arange(0, 64)[None, :], mask=live[:, None], other=0)
    scales = tl.load((base + block_size * 64 + slot * 4)[:, None] + tl.arange(0, 4)[None, :], mask=live[:, None],
                     other=127)
    return mxfp4_decode(packed, scales, R, 128)


@triton.jit
def index_queries_bf16(q_ptr, q_scale_ptr, row_head, live, N: tl.constexpr, Q_MXFP4: tl.constexpr,
                       FP8_SOFT: tl.constexpr):
    """Indexer query vectors ``row_head`` (int64 ``[N]``, the flat (row, head) index) as bf16 ``[N, 128]``,
    0 where ``live`` is False; exact: OCP e4m3 bytes ``[.., 128]`` (``e4m3_byte_to_f32`` of the path), or
    MXFP4 packed e2m1 ``[.., 64]`` with UE8M0 bytes ``[.., 4]`` (``mxfp4_decode``): bf16 holds e4m3 values
    and e2m1 values times any UE8M0 scale exactly."""
    if Q_MXFP4:
        packed = tl.load(q_ptr + row_head[:, None] * 64 + tl.arange(0, 64)[None, :], mask=live[:, None], other=0)
        scales = tl.load(q_scale_ptr + row_head[:, None] * 4 + tl.arange(0, 4)[None, :], mask=live[:, None],
                         other=127)
        q = mxfp4_decode(packed, scales, N, 128)
    else:
        q = e4m3_byte_to_f32(tl.load(q_ptr + row_head[:, None] * 128 + tl.arange(0, 128)[None, :],
                                     mask=live[:, None], other=0), FP8_SOFT)
    return q.to(tl.bfloat16)


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
