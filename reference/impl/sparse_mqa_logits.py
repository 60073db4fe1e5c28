"""Reference for op 16, docs/ops.md §16: §11's weighted-ReLU logits at the candidate blocks' keys."""
from __future__ import annotations

import torch

from dsv4ops.rows import candidate_columns

CHUNK_ELEMENTS = 1 << 24          # gathered key values held at once: rows per chunk = this / (columns * 128)


def candidate_logits(q: torch.Tensor, weights: torch.Tensor, valid: torch.Tensor, keys_of) -> torch.Tensor:
    """fp32 ``[R, C]``: ``sum_h weights[r, h] * relu(q[r, h] . K)`` for the key ``keys_of(rows, valid)``
    (fp32 ``[rows, C, 128]``) of each valid column, -inf elsewhere; q fp32 ``[R, H, 128]``. Row chunks
    bound the gathered keys' memory."""
    R, C = valid.shape
    result = torch.full((R, C), float("-inf"), device=q.device)
    step = max(1, CHUNK_ELEMENTS // max(1, C * 128))
    for r0 in range(0, R, step):
        rows = slice(r0, min(R, r0 + step))
        if not bool(valid[rows].any()):                 # nothing to gather (no keys at all, S = 0 included)
            continue
        scores = torch.einsum("rhd,rcd->rhc", q[rows], keys_of(rows, valid[rows])).relu()
        logits = torch.einsum("rh,rhc->rc", weights[rows], scores)
        result[rows] = torch.where(valid[rows], logits, float("-inf"))
    return result


def sparse_mqa_logits(a):
    pos = candidate_columns(a.blocks, a.sparse_block)
    ks = a.ks.to(torch.int64)[:, None]
    valid = (pos >= 0) & (pos < (a.ke.to(torch.int64)[:, None] - ks))
    key = torch.where(valid, ks + pos, 0)

    def keys_of(rows, live):
        k = key[rows]
        return torch.where(live[..., None], a.k[k].to(torch.float32) * a.k_scale[k][..., None], 0.0)

    result = candidate_logits(a.q.to(torch.float32), a.weights, valid, keys_of)
    return result if a.out is None else a.out.copy_(result)
