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
