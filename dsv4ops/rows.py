"""Row ranges shared by paged_mqa_logits and indexer_topk (docs/ops.md §3, §5)."""
from __future__ import annotations

import torch


def decode_row_ends(seq_lens: torch.Tensor, next_n: int) -> torch.Tensor:
    """Valid-column count per decode row ``r = b * next_n + j``, int64 ``[B * next_n]``.

    1-D ``seq_lens [B]``: ``max(0, L_b - next_n + j + 1)`` (causal MTP rule);
    2-D ``seq_lens [B, next_n]``: ``seq_lens[b, j]``.
    """
    if seq_lens.dim() == 2:
        return seq_lens.to(torch.int64).reshape(-1)
    return causal_row_lengths(seq_lens, next_n).reshape(-1)


def causal_row_lengths(seq_lens: torch.Tensor, next_n: int) -> torch.Tensor:
    """int64 ``[B, next_n]``: ``max(0, L_b - next_n + j + 1)``, the causal MTP rule applied to 1-D
    ``seq_lens [B]`` (the 2-D form of the same lengths)."""
    j = torch.arange(next_n, device=seq_lens.device)
    return (seq_lens.to(torch.int64)[:, None] - next_n + j + 1).clamp_min(0)


def row_bounds(row_starts, row_ends, seq_lens, next_n) -> tuple[torch.Tensor, torch.Tensor]:
    """indexer_topk's valid column range ``[start, end)`` per row, int64 ``[R]`` each."""
    if seq_lens is not None:
        ends = decode_row_ends(seq_lens, next_n)
        return torch.zeros_like(ends), ends
    return row_starts.to(torch.int64), row_ends.to(torch.int64)


def candidate_columns(blocks: torch.Tensor, sparse_block: int) -> torch.Tensor:
    """Row-local position of every column of a sparse logits row, int64 ``[R, num_blocks *
    sparse_block]``: column ``c`` is position ``blocks[r, c // sparse_block] * sparse_block + c %
    sparse_block``, -1 under an empty (-1) block (docs/ops.md §15)."""
    R, nb = blocks.shape
    offset = torch.arange(sparse_block, device=blocks.device)
    first = blocks.to(torch.int64)[:, :, None]
    return torch.where(first >= 0, first * sparse_block + offset, -1).reshape(R, nb * sparse_block)


def bad_candidate_rows(blocks: torch.Tensor, lens: torch.Tensor, sparse_block: int) -> torch.Tensor:
    """bool ``[R]``: rows of ``blocks`` that break the contract of §15: valid entries first, strictly
    ascending, each a block holding a visible position (``0 <= b < ceil(lens / sparse_block)``), then
    only -1."""
    b = blocks.to(torch.int64)
    limit = (lens.to(torch.int64)[:, None] + sparse_block - 1) // sparse_block
    valid = b >= 0
    bad = (valid & (b >= limit)) | (b < -1)
    bad[:, 1:] |= valid[:, 1:] & ~valid[:, :-1]                                 # a block after a -1
    bad[:, 1:] |= valid[:, 1:] & valid[:, :-1] & (b[:, 1:] <= b[:, :-1])       # not strictly ascending
    return bad.any(1)
