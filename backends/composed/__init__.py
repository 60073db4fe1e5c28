"""The composed backend: the indexer in one call (``paged_mqa_topk``, ``mqa_topk``; docs/ops.md §12,
§13) as the two ops it is made of, each run by the implementation dispatch chooses for it (a vendor's
logits kernel where one serves, else Triton's; the best top-k), over chunks of requests whose logits
fit a bounded workspace (``dsv4ops.composition``). It serves the two ops wherever a kernel, not only
the reference, serves both of their parts, so they reach every platform their parts reach.

Its capability check asks dispatch for each part, with the part's dispatch key derived from the
call's (``DispatchKey.derived``): it declines when a part is served by the reference alone or by
nothing, naming the part. The prefill logits' width is the key count, a leading size the key does
not hold (``None`` in the part's ``logits`` shape). Priority: below Triton's own implementations
(``priorities.PRIORITY``), which fuse or chunk the same steps without the two dispatches.
"""
from __future__ import annotations

from typing import NamedTuple

import torch

from dsv4ops import selection
from dsv4ops.opspec import DispatchKey, TensorMeta
from dsv4ops.registry import Backend, register_backend

BACKEND = register_backend(Backend(
    "composed", ("cuda", "rocm", "xpu", "cpu"),
    description="paged_mqa_topk / mqa_topk as their logits and top-k ops, each dispatched, over bounded chunks",
))


class _Part(NamedTuple):
    """What ``selection.decide`` reads of a call: one part of a composed call."""

    op: str
    device: torch.device
    key: DispatchKey


def _served(op: str, fields: dict, key) -> str | None:
    """Why part ``op`` (its arguments' key ``fields``) cannot be run by a kernel, or None."""
    decision = selection.decide(_Part(op, key.device, DispatchKey.derived(op, fields, key.device, key.size_class)))
    if decision.selected is None:
        return f"part {op}: {decision.error}"
    if decision.backend == "reference":
        return f"part {op} is served by the reference alone here"
    return None


def _topk_fields(key, logits_width, seq_lens, next_n, ranges: bool) -> dict:
    return dict(logits=TensorMeta(torch.float32, key.device, (None, logits_width)), k=key.topk,
                row_starts=key.ks if ranges else None, row_ends=key.ke if ranges else None, seq_lens=seq_lens,
                next_n=next_n, out=TensorMeta(torch.int32, key.device, (None, key.topk)))


def paged_parts(plat, key) -> str | None:
    """paged_mqa_logits into an fp32 ``[rows, max_context_len]`` chunk, then indexer_topk on it."""
    logits = {name: key.get(name) for name in ("q", "kv_cache", "weights", "context_lens", "block_table",
                                               "max_context_len", "q_scale")}
    logits.update(clean=False, out=TensorMeta(torch.float32, key.device, (None, key.max_context_len)))
    return (_served("paged_mqa_logits", logits, key)
            or _served("indexer_topk", _topk_fields(key, key.max_context_len, key.context_lens, key.q.shape[1],
                                                    ranges=False), key))


def prefill_parts(plat, key) -> str | None:
    """mqa_logits into an fp32 ``[rows, keys]`` chunk, then indexer_topk over each row's key range."""
    logits = {name: key.get(name) for name in ("q", "k", "k_scale", "weights", "ks", "ke", "q_scale")}
    logits.update(clean=False, out=TensorMeta(torch.float32, key.device, (None, None)))
    return (_served("mqa_logits", logits, key)
            or _served("indexer_topk", _topk_fields(key, None, None, 1, ranges=True), key))


BACKEND.implements("paged_mqa_topk", "dsv4ops.backends.composed.ops:paged_mqa_topk", supports=paged_parts)
BACKEND.implements("mqa_topk", "dsv4ops.backends.composed.ops:mqa_topk", supports=prefill_parts)
