"""The indexer in one call as its two ops (docs/ops.md §12, §13): ``paged_mqa_topk`` / ``mqa_topk``
over chunks of requests (query rows) whose logits fit a byte budget, each chunk a logits call into
one fp32 workspace, then an ``indexer_topk`` call on it. The workspace is at most the budget (or
one request's rows), never ``[rows, context]``.

Shared by the Triton backend's chunks path (its own kernels) and the ``composed`` backend (the
implementation dispatch chooses for each of the two ops): both iterate the same steps.
"""
from __future__ import annotations

from collections.abc import Iterator

import torch

DECODE_CHUNK_BYTES = 4 << 20       # paged_mqa_topk: logits per chunk (docs/perf/README.md, "Indexer in one call")
PREFILL_CHUNK_BYTES = 16 << 20     # mqa_topk


def paged_output(a) -> tuple[torch.Tensor, bool]:
    """A ``paged_mqa_topk`` call's indices (``a.out``, or a new int32 ``[B * next_n, topk]``) and
    whether the call is already answered (no requests)."""
    B, next_n = a.q.shape[:2]
    out = torch.empty(B * next_n, a.topk, dtype=torch.int32, device=a.q.device) if a.out is None else a.out
    return out, B == 0


def prefill_output(a) -> tuple[torch.Tensor, bool]:
    """An ``mqa_topk`` call's indices (``a.out``, or a new int32 ``[T, topk]``) and whether the call is
    already answered: no query rows, or no keys (every row -1, written here)."""
    T, S = a.q.shape[0], a.k.shape[0]
    out = torch.empty(T, a.topk, dtype=torch.int32, device=a.q.device) if a.out is None else a.out
    if T and not S:
        out.fill_(-1)
    return out, T == 0 or S == 0


def per_chunk(row_bytes: int, budget: int) -> int:
    """How many units of ``row_bytes`` logits fit ``budget`` bytes (at least one)."""
    return max(1, budget // max(1, row_bytes))


def paged_steps(a, out: torch.Tensor, budget: int) -> Iterator[tuple[dict, dict]]:
    """Per chunk of requests of a ``paged_mqa_topk`` call (typed args ``a``, indices into ``out``
    int32 ``[B * next_n, topk]``): the ``paged_mqa_logits`` arguments, whose ``out`` is the chunk's
    slice of one fp32 workspace, and the ``indexer_topk`` arguments but ``logits``."""
    B, next_n = a.q.shape[:2]
    chunk = per_chunk(next_n * a.max_context_len * 4, budget)
    workspace = torch.empty(min(chunk, B) * next_n, a.max_context_len, dtype=torch.float32, device=a.q.device)
    for b0 in range(0, B, chunk):
        b1 = min(B, b0 + chunk)
        rows = slice(b0 * next_n, b1 * next_n)
        yield (dict(q=a.q[b0:b1], kv_cache=a.kv_cache, weights=a.weights[rows], context_lens=a.context_lens[b0:b1],
                    block_table=a.block_table[b0:b1], max_context_len=a.max_context_len,
                    q_scale=None if a.q_scale is None else a.q_scale[b0:b1], clean=False,
                    out=workspace[: (b1 - b0) * next_n]),
               dict(k=a.topk, row_starts=None, row_ends=None, seq_lens=a.context_lens[b0:b1], next_n=next_n,
                    out=out[rows]))


def prefill_steps(a, out: torch.Tensor, budget: int) -> Iterator[tuple[dict, dict]]:
    """As ``paged_steps`` for an ``mqa_topk`` call (``out`` int32 ``[T, topk]``; ``S > 0`` keys):
    the ``mqa_logits`` and ``indexer_topk`` arguments per chunk of query rows."""
    T, S = a.q.shape[0], a.k.shape[0]
    chunk = per_chunk(S * 4, budget)
    workspace = torch.empty(min(chunk, T), S, dtype=torch.float32, device=a.q.device)
    for t0 in range(0, T, chunk):
        rows = slice(t0, min(T, t0 + chunk))
        yield (dict(q=a.q[rows], k=a.k, k_scale=a.k_scale, weights=a.weights[rows], ks=a.ks[rows], ke=a.ke[rows],
                    q_scale=None if a.q_scale is None else a.q_scale[rows], clean=False,
                    out=workspace[: rows.stop - rows.start]),
               dict(k=a.topk, row_starts=a.ks[rows], row_ends=a.ke[rows], seq_lens=None, next_n=1, out=out[rows]))
