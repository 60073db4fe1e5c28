"""What a deployment's kernels can meet: the model's dimensions per rank, the engine's limits, and
where it runs. Warm-up declarations (``Implementation.warmup``) read these to list the calls that
reach every variant they can compile; ``dsv4ops.warmup`` builds them from presets and overrides."""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from . import formats, shapes
from .errors import InputError

PRESETS = {"v4-flash": "flash", "v4-pro": "pro"}
TP_DEGREES = (1, 2, 4, 8)
TOPK_MODES = ("ranges", "decode1d", "decode2d")


@dataclass(frozen=True)
class ModelDims:
    """A model's dimensions per tensor-parallel rank (docs/ops.md §0)."""

    heads: int                          # attention query heads
    o_groups: int                       # output-projection groups (fp8_einsum's H)
    index_topk: int                     # indexer selections per token
    index_heads: int = shapes.INDEX_HEADS
    window: int = shapes.WINDOW         # sliding-window selections per token
    o_lora_rank: int = shapes.O_LORA_RANK   # fp8_einsum's D
    o_group_k: int = shapes.O_GROUP_K       # fp8_einsum's R
    v41_index_heads: int = shapes.V41_INDEX_HEADS   # the two-level indexer's heads (V4.1)
    candidate_block: int = shapes.CANDIDATE_BLOCK      # positions per candidate block (candidate_blocks' sparse_block)
    candidate_blocks: int = shapes.CANDIDATE_BLOCKS    # candidate blocks per row (candidate_blocks' num_blocks)


def model_dims(preset: str = "v4-flash", tp: int = 1, **overrides) -> ModelDims:
    """``preset`` ("v4-flash", "v4-pro") at tensor parallelism ``tp``, fields overridden by keyword."""
    if preset not in PRESETS:
        raise InputError(f"model preset {preset!r}: expected one of {', '.join(PRESETS)}")
    if tp not in TP_DEGREES:
        raise InputError(f"tp={tp}: expected one of {TP_DEGREES}")
    name, rank = PRESETS[preset], TP_DEGREES.index(tp)
    dims = ModelDims(heads=shapes.HEADS_PER_RANK[name][rank], o_groups=shapes.O_GROUPS_PER_RANK[name][rank],
                     index_topk=shapes.INDEX_TOPK[name])
    return _replace(dims, overrides, "model")


@dataclass(frozen=True)
class Limits:
    """What an engine's steps can ask for. ``max_context`` counts tokens; the indexer's rows are C4
    compressed tokens (a quarter), rounded up to whole ``c4_block`` pages."""

    max_tokens: int = 8192              # tokens per step (a prefill chunk, or decode requests x next_n)
    max_context: int = 131072           # tokens of one request's context
    next_n: int = 1                     # rows per decode request (1 + MTP draft tokens)
    swa_block: int = shapes.SWA_BLOCK   # page size (tokens) of the sliding-window cache
    c4_block: int = shapes.C4_BLOCK     # page size (compressed tokens) of the C4 caches
    c128_block: int = shapes.C128_BLOCK  # page size (compressed tokens) of the C128 cache
    layouts: tuple[str, ...] = ("fp8_ds_mla",)   # attention cache layouts
    topk_modes: tuple[str, ...] = TOPK_MODES      # how indexer_topk gets its rows (indexer_topk's modes)
    index_layouts: tuple[str, ...] = tuple(formats.INDEX_LAYOUTS)   # indexer key caches (two-level ops)

    @property
    def index_width(self) -> int:
        """The widest indexer row: the C4 compressed tokens of ``max_context``, whole pages."""
        entries = -(-self.max_context // 4)
        return -(-entries // self.c4_block) * self.c4_block


def engine_limits(**values) -> Limits:
    """Limits with the given fields (a clear error naming an unknown one or a bad value)."""
    lim = _replace(Limits(), values, "limits")
    for name in ("max_tokens", "max_context", "next_n", "swa_block", "c4_block", "c128_block"):
        if getattr(lim, name) < 1:
            raise InputError(f"limits: {name}={getattr(lim, name)} must be at least 1")
    bad = [m for m in lim.topk_modes if m not in TOPK_MODES]
    if bad:
        raise InputError(f"limits: topk_modes {bad} unknown; expected some of {', '.join(TOPK_MODES)}")
    bad = [x for x in lim.index_layouts if x not in formats.INDEX_LAYOUTS]
    if bad:
        raise InputError(f"limits: index_layouts {bad} unknown; expected some of {', '.join(formats.INDEX_LAYOUTS)}")
    return lim


@dataclass(frozen=True)
class Machine:
    """Where the warmed kernels run: the platform (``dsv4ops.Platform``), the torch device and the
    multiprocessors a grid fills there (``dsv4ops.platform.multiprocessors``)."""

    platform: Any
    device: Any
    sms: int


def _replace(obj, values: dict, what: str):
    names = {f.name for f in dataclasses.fields(obj)}
    unknown = sorted(set(values) - names)
    if unknown:
        raise InputError(f"{what}: unknown field(s) {', '.join(unknown)}; fields are {', '.join(sorted(names))}")
    return dataclasses.replace(obj, **values)
