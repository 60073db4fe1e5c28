"""vLLM's selections and weights in dsv4ops' terms: the sliding window and C128's dense
selection as request-local indices, and ``wo_a`` as ``fp8_einsum`` operands. Imports no vLLM.
"""
from __future__ import annotations

import torch

WEIGHT_BLOCK = 128       # fp8_einsum's 128 x 128 weight blocks (V4's wo_a)


def window_local(positions: torch.Tensor, window: int) -> torch.Tensor:
    """Request-local positions of each token's sliding window (-1 before the request's start);
    int32 ``[T, window]``."""
    local = (positions - window + 1).clamp(min=0)[:, None] + torch.arange(window, device=positions.device)
    return torch.where(local <= positions[:, None], local, -1).to(torch.int32)


def dense_compressed_local(positions: torch.Tensor, ratio: int, width: int) -> torch.Tensor:
    """C128's selection: every complete compressed entry ``< (p + 1) // ratio``; int32 ``[T, width]``."""
    cols = torch.arange(width, device=positions.device)
    count = torch.div(positions + 1, ratio, rounding_mode="floor")
    return torch.where(cols[None, :] < count[:, None], cols[None, :], -1).to(torch.int32)


def fp8_weight_blocks(weight: torch.Tensor, scale: torch.Tensor | None, groups: int, rows: int
                      ) -> tuple[torch.Tensor, torch.Tensor]:
    """``wo_a`` as fp8_einsum's ``b`` fp8 ``[G, rows, K]`` and ``b_scale`` fp32 ``[G, rows/128, K/128]``.

    An FP8 checkpoint's weight and 128 x 128 block scales are taken as they are; an unquantized
    (bf16) weight is quantized here, per 128 x 128 block, with ``scale = amax / 448``."""
    if weight.dtype == torch.float8_e4m3fn and scale is not None:
        b, s = weight, scale.to(torch.float32)
    else:
        w = weight.to(torch.float32)
        n, k = w.shape
        blocks = w.view(n // WEIGHT_BLOCK, WEIGHT_BLOCK, k // WEIGHT_BLOCK, WEIGHT_BLOCK)
        s = blocks.abs().amax(dim=(1, 3)).clamp(min=1e-12) / 448.0
        b = (blocks / s[:, None, :, None]).view(n, k).clamp(-448, 448).to(torch.float8_e4m3fn)
    k = b.shape[1]
    return (b.reshape(groups, rows, k).contiguous(),
            s.reshape(groups, rows // WEIGHT_BLOCK, k // WEIGHT_BLOCK).contiguous())
