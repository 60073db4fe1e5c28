"""GPT-J interleaved RoPE on the last 64 dims (docs/ops.md §1), shared by the references."""
from __future__ import annotations

import torch

from dsv4ops.formats import ROPE_DIM


def cos_sin(cos_sin_cache: torch.Tensor, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Rows of the cache at ``positions``: cos, sin fp32 ``[T, 32]``."""
    rows = cos_sin_cache[positions.to(torch.int64)].to(torch.float32)
    return rows[:, : ROPE_DIM // 2], rows[:, ROPE_DIM // 2:]


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """fp32 ``x [..., D]`` with the pairs of its last 64 dims (``(448+2i, 448+2i+1)`` for D = 512)
    rotated by ``(cos[i], sin[i])``."""
    start = x.shape[-1] - ROPE_DIM
    even, odd = x[..., start::2], x[..., start + 1::2]
    rot = torch.stack([even * cos - odd * sin, even * sin + odd * cos], dim=-1).flatten(-2)
    return torch.cat([x[..., :start], rot], dim=-1)
