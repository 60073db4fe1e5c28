"""Row ranges shared by paged_mqa_logits and indexer_topk (docs/ops.md §3, §5)."""
from __future__ import annotations

import torch


def decode_row_ends(seq_lens: torch.Tensor, next_n: int) -> torch.Tensor:
    """Valid-column count per decode row ``r = b * next_n + j``, int64 ``[B * next_n]``.

    1-D ``seq_lens [B]``: ``max(0, L_b - next_n + j + 1)`` (causal MTP rule);
    2-D ``seq_lens [B, next_n]``: ``seq_lens[b, j]``.
    """
    lens = seq_lens.to(torch.int64)
    if lens.dim() == 2:
        return lens.reshape(-1)
    j = torch.arange(next_n, device=lens.device)
    return (lens[:, None] - next_n + j + 1).clamp_min(0).reshape(-1)


def row_bounds(row_starts, row_ends, seq_lens, next_n) -> tuple[torch.Tensor, torch.Tensor]:
    """indexer_topk's valid column range ``[start, end)`` per row, int64 ``[R]`` each."""
    if seq_lens is not None:
        ends = decode_row_ends(seq_lens, next_n)
        return torch.zeros_like(ends), ends
    return row_starts.to(torch.int64), row_ends.to(torch.int64)
