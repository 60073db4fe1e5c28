"""Exact FP8 / UE8M0 arithmetic shared by the reference, the formats and the tests.

`fp8` is OCP float8_e4m3fn (max 448) unless the FNUZ flavour (gfx942, max 240) is named.
A UE8M0 byte ``e`` stands for ``2**(e - 127)``.
"""
from __future__ import annotations

import torch

FP8_DTYPE = {"ocp": torch.float8_e4m3fn, "fnuz": torch.float8_e4m3fnuz}
FP8_MAX = {"ocp": 448.0, "fnuz": 240.0}


def as_float(x) -> float:
    """A scale given as a Python number or a 1-element tensor, as a float (syncs for device tensors)."""
    return float(x.item()) if isinstance(x, torch.Tensor) else float(x)


def ceil_log2(x: torch.Tensor) -> torch.Tensor:
    """``ceil(log2(x))`` for positive normal fp32 ``x``, exact (read off the fp32 bits, no float log2)."""
    bits = x.to(torch.float32).contiguous().view(torch.int32)
    exponent = ((bits >> 23) & 0xFF) - 127
    return exponent + ((bits & 0x7FFFFF) != 0).to(torch.int32)


def pow2(e: torch.Tensor) -> torch.Tensor:
    """``2.0 ** e`` as exact fp32 for integer ``e`` in [-127, 127]."""
    return ue8m0_to_float((e + 127).clamp(0, 254).to(torch.uint8))


def ue8m0_to_float(byte: torch.Tensor) -> torch.Tensor:
    """Decode UE8M0 bytes (uint8) to fp32; 255 is NaN as in ``torch.float8_e8m0fnu``."""
    return byte.contiguous().view(torch.float8_e8m0fnu).to(torch.float32)


def ue8m0_scale(amax: torch.Tensor, flavour: str = "ocp") -> tuple[torch.Tensor, torch.Tensor]:
    """Power-of-two scale covering ``amax`` (already floored): ``(scale fp32, ue8m0 byte uint8)``.

    ``e = ceil(log2(amax / fp8_max))`` with the division in fp32, as the vLLM/DeepGEMM writers do.
    """
    e = ceil_log2(amax.to(torch.float32) / FP8_MAX[flavour])
    byte = (e + 127).clamp(0, 255).to(torch.uint8)
    return ue8m0_to_float(byte), byte


def to_fp8(x: torch.Tensor, flavour: str = "ocp") -> torch.Tensor:
    """Round-to-nearest-even to e4m3 after saturating at ±fp8_max (NaN stays NaN)."""
    limit = FP8_MAX[flavour]
    return x.to(torch.float32).clamp(-limit, limit).to(FP8_DTYPE[flavour])


def pack_ue8m0_scales(scales: torch.Tensor) -> torch.Tensor:
    """fp32 power-of-two scales ``[..., n]`` -> int32 ``[..., ceil(n/4)]``, 4 UE8M0 bytes each, LSB first.

    This is DeepGEMM's packed-UE8M0 layout (recipe (1,1,128) on SM100). Raises ``ValueError`` if a
    scale is not a positive power of two.
    """
    s = scales.to(torch.float32)
    bits = s.contiguous().view(torch.int32)
    if bool(((bits & 0x7FFFFF) != 0).any()) or bool((s <= 0).any()):
        raise ValueError("pack_ue8m0_scales: every scale must be a positive power of two (UE8M0)")
    byte = ((bits >> 23) & 0xFF).to(torch.int32)
    n = byte.shape[-1]
    pad = (-n) % 4
    if pad:
        byte = torch.nn.functional.pad(byte, (0, pad), value=127)
    byte = byte.reshape(*byte.shape[:-1], -1, 4).to(torch.int64)
    words = (byte << torch.tensor([0, 8, 16, 24], device=byte.device)).sum(-1)
    return torch.where(words >= 2**31, words - 2**32, words).to(torch.int32)


# ---------------------------------------------------------------------------------------------
# DeepSeek-V4.1 token records (docs/ops.md §6): the bit-exact truth for every writer.

V41_DIM = 512
SCALE_BLOCKS = (128, 32)                # block-scaled fp8 GEMM operands: V4's 128 x 128 blocks, V4.1's 32 x 32


def scale_block(D: int, R: int, scale_shape) -> int | None:
    """The width ``w`` of the square blocks of a ``[D, R]`` fp8 operand whose scales have the shape
    ``scale_shape`` = ``(D / w, R / w)``: 128 or 32 (128 where both fit, i.e. D = R = 0); None when
    neither fits."""
    for w in SCALE_BLOCKS:
        if D % w == 0 and R % w == 0 and tuple(scale_shape) == (D // w, R // w):
            return w
    return None


MX_BLOCK = 32                           # MXFP8: values per UE8M0 scale
MX_QUOTIENT_FLOOR = 1e-4                # MXFP8: floor on amax / 448 (FlashMLA tests/quant.py, vLLM)
NV_BLOCK = 16                           # NVFP4: values per e4m3 scale
MXFP4_QUOTIENT_FLOOR = 2.0 ** -126      # MXFP4: floor on amax / 6 (vLLM's amax floor 6 * 2**-126)
E2M1_MAX = 6.0
E4M3_MIN_SUBNORMAL = 2.0 ** -9
E4M3_NAN_BYTE = 0x7F
# e2m1 magnitude of each 3-bit code, and the boundaries between neighbours: a magnitude past a
# "strict" boundary rounds up, one equal to it rounds to the even code (RNE).
E2M1_VALUES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)
_E2M1_UP_IF_GREATER = (0.25, 1.25, 2.5, 5.0)      # the tie goes down (to an even code)
_E2M1_UP_IF_AT_LEAST = (0.75, 1.75, 3.5)          # the tie goes up (to an even code)


def _blocks(rows: torch.Tensor, block: int, what: str, dim: int = V41_DIM) -> torch.Tensor:
    if rows.dim() != 2 or rows.shape[1] != dim:
        raise ValueError(f"{what}: rows must be [N, {dim}], got {list(rows.shape)}")
    return rows.to(torch.float32).reshape(rows.shape[0], dim // block, block)


def _pack_nibbles(codes: torch.Tensor) -> torch.Tensor:
    """4-bit codes uint8 ``[N, 2m]`` -> bytes ``[N, m]``: code ``2i`` in the low nibble of byte ``i``."""
    return codes[:, 0::2] | (codes[:, 1::2] << 4)


def _unpack_nibbles(packed: torch.Tensor) -> torch.Tensor:
    """Bytes ``[..., m]`` -> 4-bit codes ``[..., 2m]`` (low nibble first)."""
    return torch.stack([packed & 0xF, packed >> 4], dim=-1).reshape(*packed.shape[:-1], 2 * packed.shape[-1])


def encode_mxfp8(rows: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """fp32 rows ``[N, 512]`` -> (e4m3 values uint8 ``[N, 512]``, UE8M0 scales uint8 ``[N, 16]``).

    Per 32 consecutive values: ``e = ceil(log2(max(amax / 448, 1e-4)))`` (fp32 quotient),
    byte ``e + 127``, values ``sat_e4m3(x / 2**e)`` RNE. A NaN in a block makes its byte 255
    (UE8M0 NaN) and its values NaN; an infinity makes its byte 255 too.
    """
    blocks = _blocks(rows, MX_BLOCK, "encode_mxfp8")
    quotient = (blocks.abs().amax(-1) / FP8_MAX["ocp"]).clamp_min(MX_QUOTIENT_FLOOR)
    byte = (ceil_log2(quotient) + 127).clamp(0, 255).to(torch.uint8)
    values = to_fp8(blocks / ue8m0_to_float(byte).unsqueeze(-1))
    return values.reshape(rows.shape[0], V41_DIM).view(torch.uint8), byte


def decode_mxfp8(values: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """(uint8 values ``[..., 512]``, UE8M0 bytes ``[..., 16]``) -> fp32 ``[..., 512]``."""
    lead = values.shape[:-1]
    v = values.contiguous().view(torch.float8_e4m3fn).to(torch.float32).reshape(*lead, -1, MX_BLOCK)
    return (v * ue8m0_to_float(scales).unsqueeze(-1)).reshape(*lead, V41_DIM)


def e2m1_code(x: torch.Tensor) -> torch.Tensor:
    """fp32 -> 4-bit e2m1 codes (uint8): RNE, saturating at ±6, sign bit kept for -0 and for
    negatives that round to 0; NaN -> 0."""
    m = torch.nan_to_num(x.abs(), nan=0.0)
    code = sum((m > b).to(torch.uint8) for b in _E2M1_UP_IF_GREATER)
    code = code + sum((m >= b).to(torch.uint8) for b in _E2M1_UP_IF_AT_LEAST)
    sign = (torch.signbit(x) & ~torch.isnan(x)).to(torch.uint8) << 3
    return code | sign


def e2m1_value(code: torch.Tensor) -> torch.Tensor:
    """4-bit e2m1 codes (uint8) -> fp32."""
    table = torch.tensor(E2M1_VALUES, dtype=torch.float32, device=code.device)
    mag = table[(code & 7).to(torch.int64)]
    return torch.where((code & 8) != 0, -mag, mag)


def encode_nvfp4(rows: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """fp32 rows ``[N, 512]`` -> (packed e2m1 uint8 ``[N, 256]``, e4m3 scales uint8 ``[N, 32]``).

    Per 16 consecutive values: scale ``e4m3_RNE(clamp(amax / 6, 2**-9, 448))``, values
    ``e2m1_RNE(x / scale)`` (fp32 division by the decoded scale) saturating at ±6; value ``2i`` in
    the low nibble of byte ``i``, ``2i + 1`` in the high one. A NaN in a block makes its scale byte
    0x7F (e4m3 NaN) and its nibbles 0.
    """
    blocks = _blocks(rows, NV_BLOCK, "encode_nvfp4")
    amax = blocks.abs().amax(-1)
    nan_block = torch.isnan(amax)
    scale = (amax / E2M1_MAX).clamp(E4M3_MIN_SUBNORMAL, FP8_MAX["ocp"]).to(torch.float8_e4m3fn)
    byte = torch.where(nan_block, E4M3_NAN_BYTE, scale.view(torch.uint8))
    codes = e2m1_code(blocks / scale.to(torch.float32).unsqueeze(-1))
    codes = torch.where(nan_block.unsqueeze(-1), 0, codes).to(torch.uint8).reshape(rows.shape[0], V41_DIM)
    return _pack_nibbles(codes), byte


def decode_nvfp4(packed: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """(packed e2m1 uint8 ``[..., 256]``, e4m3 scale bytes ``[..., 32]``) -> fp32 ``[..., 512]``."""
    lead = packed.shape[:-1]
    codes = _unpack_nibbles(packed).reshape(*lead, -1, NV_BLOCK)
    scale = scales.contiguous().view(torch.float8_e4m3fn).to(torch.float32)
    return (e2m1_value(codes) * scale.unsqueeze(-1)).reshape(*lead, V41_DIM)


def encode_mxfp4(rows: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """fp32 rows ``[N, D]`` (D a multiple of 32) -> (packed e2m1 uint8 ``[N, D / 2]``, UE8M0 scales
    uint8 ``[N, D / 32]``): the V4.1 indexer's MXFP4 keys and queries (docs/ops.md §3.1).

    Per 32 consecutive values: ``e = max(ceil(log2(amax / 6)), -126)`` (fp32 quotient, exact; the
    floor is vLLM's amax floor ``6 * 2**-126``), byte ``e + 127``, values ``e2m1_RNE(x / 2**e)``
    saturating at ±6, the sign kept for values that round to zero; nibbles ordered as in
    ``encode_nvfp4``. A NaN or an infinity in a block makes its byte 255 (UE8M0 NaN) and its
    nibbles 0.
    """
    if rows.dim() != 2 or rows.shape[1] % MX_BLOCK:
        raise ValueError(f"encode_mxfp4: rows must be [N, D] with D a multiple of {MX_BLOCK}, "
                         f"got {list(rows.shape)}")
    blocks = _blocks(rows, MX_BLOCK, "encode_mxfp4", rows.shape[1])
    amax = blocks.abs().amax(-1)
    bad = ~torch.isfinite(amax)
    exponent = ceil_log2((amax / E2M1_MAX).clamp_min(MXFP4_QUOTIENT_FLOOR))
    byte = torch.where(bad, 255, exponent + 127).to(torch.uint8)
    codes = e2m1_code(blocks / ue8m0_to_float(byte).unsqueeze(-1))
    codes = torch.where(bad.unsqueeze(-1), 0, codes).to(torch.uint8).reshape(rows.shape)
    return _pack_nibbles(codes), byte


def decode_mxfp4(packed: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """(packed e2m1 uint8 ``[..., D / 2]``, UE8M0 bytes ``[..., D / 32]``) -> fp32 ``[..., D]``."""
    lead = packed.shape[:-1]
    codes = _unpack_nibbles(packed).reshape(*lead, scales.shape[-1], MX_BLOCK)
    return (e2m1_value(codes) * ue8m0_to_float(scales).unsqueeze(-1)).reshape(*lead, 2 * packed.shape[-1])
