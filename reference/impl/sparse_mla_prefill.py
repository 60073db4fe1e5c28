"""Reference for sparse_mla_prefill (docs/ops.md §10, whose math is §2): the decode reference
applied to chunks of query tokens, so that production prefill shapes (T = 8192, 1152 selected rows,
128 heads) fit in memory."""
from __future__ import annotations

import torch

from .sparse_mla_decode import output_magnitude as decode_magnitude
from .sparse_mla_decode import sparse_mla_decode

CHUNK_ELEMENTS = 1 << 28        # fp32 gathered rows per chunk: tokens * (topk + extra_topk) * 512


def sparse_mla_prefill(a):
    T, H, D = a.q.shape
    out = a.out if a.out is not None else torch.empty(T, H, D, dtype=torch.bfloat16, device=a.q.device)
    lse = torch.empty(T, H, dtype=torch.float32, device=a.q.device)
    for rows, part in _chunks(a):
        lse[rows] = sparse_mla_decode(part._replace(out=out[rows], need_lse=True))[1]
    return out, lse if a.need_lse else None


def output_magnitude(a) -> torch.Tensor:
    """The decode reference's ``output_magnitude``, chunk by chunk."""
    return torch.cat([decode_magnitude(part) for _, part in _chunks(a)]) if a.q.shape[0] else \
        torch.zeros(a.q.shape, dtype=torch.float32, device=a.q.device)


def _chunks(a):
    """(token slice, the args restricted to it) over chunks of at most CHUNK_ELEMENTS gathered values."""
    T, _, D = a.q.shape
    width = a.indices.shape[1] + (a.extra_indices.shape[1] if a.extra_indices is not None else 0)
    chunk = max(1, CHUNK_ELEMENTS // max(1, width * D))
    for t0 in range(0, T, chunk):
        rows = slice(t0, min(T, t0 + chunk))
        yield rows, a._replace(q=a.q[rows], indices=a.indices[rows], out=None,
                               topk_lens=None if a.topk_lens is None else a.topk_lens[rows],
                               extra_indices=None if a.extra_indices is None else a.extra_indices[rows],
                               extra_topk_lens=None if a.extra_topk_lens is None else a.extra_topk_lens[rows])
