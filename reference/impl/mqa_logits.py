"""Reference for op 11, docs/ops.md §11 (DG ref_fp8_mqa_logits on the fp8 or MXFP4 bytes)."""
from __future__ import annotations

import torch

from dsv4ops import formats

CHUNK_ELEMENTS = 1 << 26          # fp32 scores held at once (256 MiB): rows per chunk = this / (H * S)


def mqa_logits(a):
    T, H, _ = a.q.shape
    S = a.k.shape[0]
    keys = formats.index_vectors(a.k, a.k_scale)                             # [S, 128] fp32
    cols = torch.arange(S, device=a.q.device)
    result = torch.full((T, S), float("-inf"), device=a.q.device)
    rows = max(1, CHUNK_ELEMENTS // max(1, H * S))
    for t0 in range(0, T, rows):                                           # bounded memory
        t1 = min(T, t0 + rows)
        lo, hi = int(a.ks[t0:t1].min()), int(a.ke[t0:t1].max())
        if lo >= hi:
            continue
        q_scale = None if a.q_scale is None else a.q_scale[t0:t1]
        q = formats.index_vectors(a.q[t0:t1], q_scale).reshape((t1 - t0) * H, -1)
        scores = (q @ keys[lo:hi].T).relu().view(t1 - t0, H, hi - lo)
        logits = torch.einsum("th,ths->ts", a.weights[t0:t1], scores)
        valid = (cols[lo:hi] >= a.ks[t0:t1, None]) & (cols[lo:hi] < a.ke[t0:t1, None])
        result[t0:t1, lo:hi] = torch.where(valid, logits, float("-inf"))
    return result if a.out is None else a.out.copy_(result)
