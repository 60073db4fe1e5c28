"""The gathered bf16 workspace of sparse_mla_prefill, for backends whose kernel reads one flat bf16
pool instead of the paged caches (FlashMLA ``flash_mla_sparse_fwd``, AITER ``pa_prefill_sparse``):
the step vLLM performs with ``dequantize_and_gather_k_cache`` before calling them.

Only the cache pages that some selected entry points into are dequantized, so the cost follows what
the call reads, not the cache size; counting those pages is one host synchronization, so these
implementations cannot be captured in a CUDA graph: they register ``cannot_capture=CANNOT_CAPTURE``,
and selection passes them over while a stream is capturing.
"""
from __future__ import annotations

import torch

from . import formats
from .errors import UnsupportedError

# Why an implementation built on the workspace cannot be captured (its registration's cannot_capture).
CANNOT_CAPTURE = "the gathered workspace is sized on the host: one synchronization per call"


def selected_mask(indices: torch.Tensor, lens: torch.Tensor | None) -> torch.Tensor:
    """bool ``[T, topk]``: the entry is not -1 and lies below its row's length (docs/ops.md §2)."""
    valid = indices != -1
    if lens is not None:
        valid &= torch.arange(indices.shape[1], device=indices.device) < lens[:, None].to(torch.int64)
    return valid


def _segment(cache, layout, block_size, indices, lens, kv_scale, base):
    """bf16 rows of the referenced pages ``[pages * block_size, 512]`` and the row of every selected
    entry in them (offset by ``base``; -1 where nothing is selected), int64 ``[T, topk]``."""
    valid = selected_mask(indices, lens)
    slots = indices.to(torch.int64)
    page = torch.where(valid, slots // block_size, 0)
    hits = torch.zeros(cache.shape[0], dtype=torch.int32, device=cache.device)
    hits.index_add_(0, page.reshape(-1), valid.reshape(-1).to(torch.int32))
    used = hits > 0
    pages = used.nonzero().squeeze(1)                                   # the host sync
    new_page = torch.cumsum(used, 0) - 1
    rows_of = (pages[:, None] * block_size + torch.arange(block_size, device=cache.device)).reshape(-1)
    rows = formats.read_kv(cache, layout, block_size, rows_of, kv_scale).to(torch.bfloat16)
    where = new_page[page] * block_size + slots % block_size + base
    return rows, torch.where(valid, where, -1)


def gather_workspace(a, align: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    """From sparse_mla_prefill's typed args ``a``: (rows bf16 ``[N, 512]``, indices int32 ``[T, W]``).

    The rows are the dequantized pages of the SWA cache, then of the extra cache, that the call
    selects from (at least one row, zero when nothing is selected); ``indices`` holds the SWA
    entries, then the extra ones, as rows of the workspace, -1 for every entry the call does not
    select (-1, or past its length), padded with -1 to a multiple of ``align`` columns.
    """
    if a.q.is_cuda and torch.cuda.is_current_stream_capturing():
        raise UnsupportedError(f"{CANNOT_CAPTURE}, which a CUDA graph capture cannot do; capture an "
                               f"implementation that reads the caches")
    segments = [(a.kv_cache, a.block_size, a.indices, a.topk_lens)]
    if a.extra_kv_cache is not None:
        segments.append((a.extra_kv_cache, a.extra_block_size, a.extra_indices, a.extra_topk_lens))
    pools, lists, base = [], [], 0
    for cache, block_size, indices, lens in segments:
        rows, where = _segment(cache, a.layout, block_size, indices, lens, a.kv_scale, base)
        pools.append(rows)
        lists.append(where)
        base += rows.shape[0]
    if base == 0:
        pools.append(torch.zeros(1, formats.HEAD_DIM, dtype=torch.bfloat16, device=a.q.device))
    indices = torch.cat(lists, 1)
    pad = -indices.shape[1] % align
    if pad:
        indices = torch.nn.functional.pad(indices, (0, pad), value=-1)
    return torch.cat(pools), indices.to(torch.int32)
