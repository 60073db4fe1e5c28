"""vLLM's per-layer cache views as dsv4ops caches. Imports no vLLM.

vLLM allocates every KV cache group of a hybrid model in one buffer whose pages all have the
largest group's size, so a layer's cache is a strided view: ``[num_blocks, block_size, record]``
with ``stride(0)`` larger than ``block_size * record`` bytes (93,888 B pages for the tiny V4 on the
CPU). Inside a page the bytes are exactly dsv4ops' layouts (fp8_ds_mla, docs/ops.md §6.1; the
132 B indexer keys, §6.4); only the page pitch differs, and dsv4ops' V4 layouts take contiguous
caches. So each call works on the pages it touches: ``PageWindow`` copies them into a contiguous
dsv4ops cache, renumbers the call's slots / block table onto it, and (for writing ops) copies the
pages back.
"""
from __future__ import annotations

import torch

from ... import formats


class PageWindow:
    """The pages ``pages`` (int64, sorted, distinct) of ``view`` (``[num_blocks, ...]``, any page
    stride) as a contiguous cache ``cache`` of ``page_bytes`` per page (zero padding after the
    view's bytes) shaped ``shape(len(pages))``."""

    def __init__(self, view: torch.Tensor, pages: torch.Tensor, page_shape: tuple[int, ...]):
        self.view, self.pages = view, pages
        used = view[0].numel()
        rows = view[pages].reshape(len(pages), used)            # advanced indexing copies
        page_bytes = 1
        for n in page_shape:
            page_bytes *= n
        if page_bytes != used:
            rows = torch.nn.functional.pad(rows, (0, page_bytes - used))
        self.cache = rows.reshape((len(pages),) + page_shape)

    @classmethod
    def for_slots(cls, view, page_shape, block_size: int, slots: torch.Tensor):
        """The window over every page some slot ``>= 0`` of ``slots`` falls in (page 0 when there
        is none: a call whose every index is -1 still gets a cache of one page)."""
        live = slots[slots >= 0].to(torch.int64).div(block_size, rounding_mode="floor")
        pages = torch.unique(live) if live.numel() else torch.zeros(1, dtype=torch.int64, device=view.device)
        return cls(view, pages, page_shape)

    def slots(self, slots: torch.Tensor, block_size: int) -> torch.Tensor:
        """``slots`` (page·block_size + row; negative kept) renumbered onto this window's pages."""
        live = slots >= 0
        flat = slots.to(torch.int64).clamp(min=0)
        page = torch.searchsorted(self.pages, flat.div(block_size, rounding_mode="floor"))
        renum = page.clamp(max=max(len(self.pages) - 1, 0)) * block_size + flat % block_size
        return torch.where(live, renum, -1).to(slots.dtype)

    def block_table(self, table: torch.Tensor) -> torch.Tensor:
        """A block table (page ids, all inside the window) renumbered onto the window; int32."""
        return torch.searchsorted(self.pages, table.to(torch.int64)).clamp(
            max=max(len(self.pages) - 1, 0)).to(torch.int32)

    def write_back(self) -> None:
        """Copy the window's pages (the view's bytes of each) back into vLLM's cache."""
        if not len(self.pages):
            return
        used = self.view[0].numel()
        rows = self.cache.reshape(len(self.pages), -1)[:, :used]
        self.view[self.pages] = rows.reshape((len(self.pages),) + tuple(self.view.shape[1:]))


def table_pages(table: torch.Tensor, lens_in_blocks: torch.Tensor, num_blocks: int) -> torch.Tensor:
    """The distinct page ids of each row's first ``lens_in_blocks[row]`` block-table entries."""
    cols = torch.arange(table.shape[1], device=table.device)
    used = cols[None, :] < lens_in_blocks[:, None]
    return torch.unique(table[used].to(torch.int64).clamp(0, num_blocks - 1))


def request_keys(cache: torch.Tensor, table: torch.Tensor, counts: torch.Tensor
                 ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The first ``counts[r]`` indexer keys of each request ``r`` in one buffer, request after
    request (``mqa_topk``'s keys): cache a contiguous 132 B key cache, table int ``[R, max_blocks]``
    its page ids per request, counts int ``[R]``. Returns fp8 ``[S, 128]``, fp32 ``[S]`` and the
    int64 ``[R]`` offset of each request's first key."""
    values, scales = formats.index_key_views(cache)
    block = cache.shape[1]
    counts = counts.to(torch.int64)
    offsets = torch.cumsum(counts, 0) - counts
    owner = torch.repeat_interleave(torch.arange(len(counts), device=cache.device), counts)
    column = torch.arange(owner.numel(), device=cache.device) - offsets[owner]
    page = table[owner, column.div(block, rounding_mode="floor")].to(torch.int64)
    return values[page, column % block].contiguous(), scales[page, column % block].contiguous(), offsets
