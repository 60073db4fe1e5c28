"""Every Triton tunable in one place, chosen per platform (vendor, arch).

Values are starting points measured on the H100 (see docs/perf/); other targets inherit the
defaults until someone with the hardware tunes them.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from dsv4ops.platform import Platform


@dataclass(frozen=True)
class Tuning:
    decode_block_h: int = 32        # query heads per program (>= 16 for tl.dot)
    decode_block_k: int = 32        # cache rows per step
    decode_warps: int = 8
    decode_stages: int = 1
    logits_block_t: int = 64        # compressed tokens per program
    logits_warps: int = 4
    einsum_block_m: int = 64
    einsum_block_n: int = 128
    einsum_warps: int = 4
    einsum_stages: int = 3
    topk_block: int = 2048
    topk_warps: int = 8
    insert_warps: int = 4


_TABLE = {
    ("cuda", "sm90"): Tuning(decode_block_h=32, decode_block_k=32, decode_warps=8, einsum_block_m=64,
                             einsum_block_n=128, einsum_stages=4),
    ("cpu", None): Tuning(decode_block_h=16, decode_block_k=16, topk_block=256, logits_block_t=16,
                          einsum_block_m=16, einsum_block_n=128),
}


def tuning(plat: Platform) -> Tuning:
    return _TABLE.get(plat.key) or _TABLE.get((plat.vendor, None)) or Tuning()


def multiprocessors(device: torch.device) -> int:
    """Streaming multiprocessors (or compute units) to fill; a small number under the interpreter."""
    if device.type == "cuda":
        return torch.cuda.get_device_properties(device).multi_processor_count
    if device.type == "xpu":
        return torch.xpu.get_device_properties(device).gpu_subslice_count
    return 4
