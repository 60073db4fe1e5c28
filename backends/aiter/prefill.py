"""dsv4ops sparse_mla_prefill -> ``aiter.ops.triton.attention.pa_prefill_sparse.pa_prefill_sparse``
(AITER >= 0.1.20: ``(q, unified_kv, kv_indices_prefix, kv_indptr_prefix, kv, kv_indices_extend,
kv_indptr_extend, attn_sink, softmax_scale, has_invalid=None) -> out``), gfx950 (``mla_gluon``).

- That path reads one page-size-1 pool of q's dtype: the adapter hands it the gathered bf16
  workspace (dsv4ops.workspace: the referenced pages of both caches, dequantized; one index list
  with -1 for every entry not selected), as a CSR stream without a host sync of its own: every
  token keeps its full row (``indptr = arange(T + 1) * width``), -1 sentinels skipped. The extend
  source (a second pool) is gfx1250-only and is passed as None.
- ``mla_gluon`` serves 64 or 128 heads (or at most 16): other head counts are padded with zero
  queries and -inf sinks, and sliced off.
- Sinks are clamped to +-1e30 (the same output as +-inf, without inf - inf in the kernel), and rows
  that select nothing are zeroed here (the contract says 0), as for pa_decode_sparse.
- It returns a new tensor and no log-sum-exp: only ``need_lse=False`` calls come here.
"""
from __future__ import annotations

import torch

from dsv4ops.backend_support import decode_output, pad_heads
from dsv4ops.platform import Platform
from dsv4ops.workspace import gather_workspace

from .ops import SINK_CLAMP


def gluon_heads(H: int) -> int:
    """Heads ``mla_gluon`` runs: at most 16 as they are, else 64 or 128."""
    return H if H <= 16 else 64 if H <= 64 else 128


def sparse_mla_prefill(plat: Platform, a):
    from aiter.ops.triton.attention.pa_prefill_sparse import pa_prefill_sparse

    T, H, _ = a.q.shape
    out = decode_output(a.q, a.out)
    if T == 0:
        return out, None
    rows, indices = gather_workspace(a)
    indptr = torch.arange(T + 1, dtype=torch.int32, device=a.q.device) * indices.shape[1]
    q_p, sink = pad_heads(a.q, a.attn_sink, gluon_heads(H))
    if sink is not None:
        sink = sink.clamp(-SINK_CLAMP, SINK_CLAMP).contiguous()
    o = pa_prefill_sparse(q_p, rows, indices.reshape(-1), indptr, None, None, None, sink, a.softmax_scale,
                          has_invalid=True)
    lonely = ((indices != -1).sum(1) == 0)[:, None, None]
    out.copy_(torch.where(lonely, 0.0, o[:, :H]))
    return out, None
