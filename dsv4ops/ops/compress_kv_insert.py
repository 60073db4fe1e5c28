"""Op (docs/ops.md §9): the V4 KV compressor. Saves each token's KV / gate rows in the compressor
state cache, and at every ``ratio``-th position pools the window into one entry (softmax gate,
RMSNorm, RoPE) written quantized into the compressed cache (``fp8_ds_mla``) or the indexer key cache."""
from __future__ import annotations

import torch
from torch import Tensor

from .. import formats
from ..formats import Layout
from ..opspec import Arg, OpSpec, define
from ..checker import Checker

RATIOS = (4, 128)                     # C4 (overlapping windows) and C128


def overlap(ratio: int) -> int:
    """2 for C4 (each window also pools the previous ratio tokens), else 1."""
    return 2 if ratio == 4 else 1


def check(c: Checker, a):
    try:
        layout = Layout.of(a.layout, among=formats.COMPRESSED_LAYOUTS)
    except ValueError:
        c.fail("layout", f"must be one of {list(formats.COMPRESSED_LAYOUTS)}, got {a.layout!r}")
    D = layout.head_dim
    c.int_arg("ratio", a.ratio, choices=RATIOS)
    width = overlap(a.ratio) * D
    c.tensor("kv", a.kv, dtype=(torch.float32, torch.bfloat16), shape=("T", width), anchor=True,
             last_dim_contiguous=True)
    T = a.kv.shape[0]
    c.tensor("score", a.score, dtype=(torch.float32, torch.bfloat16), shape=(T, width), last_dim_contiguous=True)
    c.tensor("positions", a.positions, dtype=torch.int64, shape=(T,))
    c.tensor("ape", a.ape, dtype=torch.float32, shape=(a.ratio, width), contiguous=True)
    c.tensor("norm_weight", a.norm_weight, dtype=(torch.float32, torch.bfloat16), shape=(D,))
    c.tensor("cos_sin_cache", a.cos_sin_cache, dtype=torch.float32, shape=("max_pos", formats.ROPE_DIM),
             contiguous=True)
    c.tensor("state_cache", a.state_cache, dtype=torch.float32, shape=("num_state_blocks", "state_block_size",
             2 * width), last_dim_contiguous=True)
    n_state_slots = a.state_cache.shape[0] * a.state_cache.shape[1]
    c.tensor("state_slot_mapping", a.state_slot_mapping, dtype=torch.int64, shape=("T'",))
    n = a.state_slot_mapping.shape[0]
    if n > T:
        c.fail("state_slot_mapping", f"must have at most T={T} entries, got {n}")
    c.tensor("state_block_table", a.state_block_table, dtype=torch.int32, shape=("num_reqs", "max_state_blocks"))
    c.tensor("token_to_req", a.token_to_req, dtype=torch.int32, shape=(n,))
    c.int_arg("block_size", a.block_size, minimum=1)
    c.tensor("kv_cache", a.kv_cache, dtype=layout.cache_dtype,
             shape=("num_blocks",) + layout.cache_shape(1, a.block_size)[1:], contiguous=True)
    c.tensor("slot_mapping", a.slot_mapping, dtype=torch.int64, shape=(n,))
    c.float_arg("eps", a.eps, positive=True)
    c.disjoint(a, "state_cache")
    c.disjoint(a, "kv_cache")
    c.in_range("positions", a.positions, 0, a.cos_sin_cache.shape[0], what="positions (rows of cos_sin_cache)")
    c.in_range("state_slot_mapping", a.state_slot_mapping, None, n_state_slots, what="state slots (negative = skip)")
    c.in_range("slot_mapping", a.slot_mapping, None, a.kv_cache.shape[0] * a.block_size,
               what="slots (negative = skip)")
    c.in_range("token_to_req", a.token_to_req, 0, a.state_block_table.shape[0], what="request ids")
    c.in_range("state_block_table", a.state_block_table, 0, a.state_cache.shape[0], what="state block ids")
    if n and c.values_checked(a.positions):
        live = a.state_slot_mapping >= 0
        pages = a.positions[:n][live] // a.state_cache.shape[1]
        c.in_range("positions", pages, None, a.state_block_table.shape[1],
                   what="state pages (position // state_block_size, within state_block_table's width)")
    return a._replace(layout=layout)


def fake(a):
    return None


SPEC = OpSpec(
    name="compress_kv_insert",
    doc="""Save KV / gate rows in the compressor state; pool every ``ratio``-th position's window into
    one compressed entry (softmax gate, RMSNorm, RoPE at the window's first position), quantized
    into ``kv_cache`` at ``slot_mapping``.

    kv, score fp32 or bf16 [T, c*D] (c = 2 for ratio 4, else 1; D = 512 for "fp8_ds_mla", 128 for
    "index_fp8"), positions int64 [T], ape fp32 [ratio, c*D], norm_weight [D],
    cos_sin_cache fp32 [max_pos, 64], state_cache fp32 [num_state_blocks, state_block_size, 2*c*D],
    state_slot_mapping / slot_mapping int64 [T'] (T' <= T, negative = skip), state_block_table int32
    [num_reqs, max_state_blocks], token_to_req int32 [T']. Writes state_cache and kv_cache; returns None.""",
    args=(
        Arg("kv", Tensor, doc="fp32/bf16 [T, c*D], the KV projection"),
        Arg("score", Tensor, doc="fp32/bf16 [T, c*D], the gate projection"),
        Arg("positions", Tensor, doc="int64 [T]"),
        Arg("ape", Tensor, doc="fp32 [ratio, c*D], learned position bias of the gate"),
        Arg("norm_weight", Tensor, doc="fp32/bf16 [D], RMSNorm weight"),
        Arg("cos_sin_cache", Tensor, doc="fp32 [max_pos, 64]"),
        Arg("state_cache", Tensor, mutated=True),
        Arg("state_slot_mapping", Tensor, doc="int64 [T'], negative = skip the token"),
        Arg("state_block_table", Tensor, doc="int32 [num_reqs, max_state_blocks]"),
        Arg("token_to_req", Tensor, doc="int32 [T']"),
        Arg("kv_cache", Tensor, mutated=True),
        Arg("slot_mapping", Tensor, doc="int64 [T'], compressed slot written at a window's last token"),
        Arg("layout", Layout, keyword_only=True),
        Arg("ratio", int, keyword_only=True),
        Arg("block_size", int, keyword_only=True),
        Arg("eps", float, 1e-6, keyword_only=True),
    ),
    outputs="()",
    check=check,
    fake=fake,
    out_variant_only=True,
)
OP = define(SPEC)
compress_kv_insert = OP.function
