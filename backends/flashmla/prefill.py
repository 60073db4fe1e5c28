"""dsv4ops sparse_mla_prefill -> flash_mla.flash_mla_sparse_fwd (sparse prefill over a bf16 pool).

The contract reads the paged caches; FlashMLA's prefill kernel reads one flat bf16 ``kv [s_kv, 1,
512]``. So the adapter first builds the gathered workspace (dsv4ops.workspace: the referenced pages
of both caches, dequantized, and one combined index list with -1 for every entry not selected, the
width padded to a multiple of 128, FlashMLA's widest index tile), as vLLM's FlashMLA backend does with
``dequantize_and_gather_k_cache``; the gather is part of this implementation's time. ``topk_length``
is not passed: the -1 entries already encode the lengths, and FlashMLA may leak NaN from rows past a
length (its docstring). Heads are padded to 64 / 128 (zero queries, -inf sinks) and sliced off.
``max_logits`` is not part of the contract and is dropped; FlashMLA's lse is natural-log, sink
excluded, +inf for lonely rows (FlashMLA's own tests/ref.py), which is ours.
"""
from __future__ import annotations

import torch

from dsv4ops.backend_support import decode_output, pad_heads
from dsv4ops.workspace import gather_workspace

from .decode import padded_heads

INDEX_TILE = 128


def sparse_mla_prefill(a):
    import flash_mla

    T, H, _ = a.q.shape
    out = decode_output(a.q, a.out)
    if T == 0:
        return out, torch.empty(0, H, dtype=torch.float32, device=a.q.device) if a.need_lse else None
    rows, indices = gather_workspace(a, align=INDEX_TILE)
    q_p, sink_p = pad_heads(a.q, a.attn_sink, padded_heads(H))
    o, _max_logits, lse = flash_mla.flash_mla_sparse_fwd(q_p, rows.unsqueeze(1), indices.unsqueeze(1), a.softmax_scale,
                                                         d_v=512, attn_sink=sink_p)
    out.copy_(o[:, :H])
    return out, lse[:, :H].contiguous() if a.need_lse else None
