"""Argument checks of the attention KV caches (the layouts of ``dsv4ops.formats``, docs/ops.md §1,
§6), shared by the ops that write or read them: the ``layout=`` argument and a cache tensor."""
from __future__ import annotations

import torch

from . import formats
from .checker import Checker, describe
from .formats import Layout

# The ``layout=`` argument's doc line, from the one list of main-cache layouts.
LAYOUT_DOC = "cache layout: " + ", ".join(f'"{name}"' for name in formats.MAIN_LAYOUTS)


def check_layout(c: Checker, layout, name: str = "layout") -> Layout:
    """The attention cache layout ``layout``: one of ``formats.MAIN_LAYOUTS`` for the main cache,
    of ``formats.LAYOUTS`` for an ``extra_layout`` (NVFP4, written by compress_kv_insert, is only
    an extra layout; docs/ops.md §6)."""
    allowed = formats.MAIN_LAYOUTS if name == "layout" else formats.LAYOUTS
    try:
        found = Layout.of(layout)
    except ValueError:
        c.fail(name, f"must be one of {list(allowed)}, got {layout!r}")
    if found.name not in allowed:
        c.fail(name, f"{found} holds compressed entries only (compress_kv_insert, extra_layout); "
                     f"a main cache is one of {list(allowed)}")
    return found


def check_kv_cache(c: Checker, name: str, cache, layout: Layout, block_size: int) -> None:
    """``cache`` must be what ``formats.allocate_kv_cache(n, block_size, layout)`` returns; a V4.1
    cache may have any page width ``>= block_size * token_bytes`` (docs/ops.md §6)."""
    if not isinstance(cache, torch.Tensor) or cache.dim() < 1:
        c.fail(name, f"must be a {layout} KV cache tensor, got {type(cache).__name__}")
    if layout.is_v41:
        c.tensor(name, cache, dtype=layout.cache_dtype, shape=("num_blocks", "page_bytes"), contiguous=True)
        if cache.shape[1] < layout.min_page_bytes(block_size):
            c.fail(name, f"pages of {cache.shape[1]} bytes are too small for block_size={block_size} "
                         f"tokens of {layout.token_bytes} bytes ({layout}): need at least "
                         f"{layout.min_page_bytes(block_size)}")
        return
    shape = layout.cache_shape(cache.shape[0], block_size)
    if cache.dim() == len(shape) and cache.shape[1:] != shape[1:]:       # the page size, from block_size
        c.fail(name, f"must be [num_blocks, {', '.join(map(str, shape[1:]))}] for block_size={block_size} "
                     f"tokens of {layout}, got {describe(cache)}: is block_size the cache's page size?")
    c.tensor(name, cache, dtype=layout.cache_dtype, shape=("num_blocks",) + shape[1:], contiguous=True)
