"""GPT-J interleaved RoPE on the last 64 dims (docs/ops.md §1), shared by the references."""
from __future__ import annotations

import torch

from dsv4ops.formats import NOPE_DIM, ROPE_DIM


def cos_sin(cos_sin_cache: torch.Tensor, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Rows of the cache at ``positions``: cos, sin fp32 ``[T, 32]``."""
    rows = cos_sin_cache[positions.to(torch.int64)].to(torch.float32)
    return rows[:, : ROPE_DIM // 2], rows[:, ROPE_DIM // 2:]


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """fp32 ``x [..., 512]`` with pairs ``(448+2i, 448+2i+1)`` rotated by ``(cos[i], sin[i])``."""
    even, odd = x[..., NOPE_DIM::2], x[..., NOPE_DIM + 1::2]
    rot = torch.stack([even * cos - odd * sin, even * sin + odd * cos], dim=-1).flatten(-2)
    return torch.cat([x[..., :NOPE_DIM], rot], dim=-1)
