"""Op 2 (docs/ops.md §2): sparse MQA decode over the SWA cache plus an optional extra cache.

Its arguments, checks, sample inputs and comparison rule are the attention family's
(dsv4ops/attention_family.py), shared with sparse_mla_prefill."""
from __future__ import annotations

import itertools

import torch

from ..attention_family import (ARGS, OUTPUTS, STRIDES, attention_rule, check, fake, grid_cases, inputs,
                                output_magnitude, v41_cases)
from ..cost import nbytes, selected_entries
from ..formats import Layout
from ..opspec import BenchShapes, Conformance, OpSpec, define
from ..sampling import change, set_args
from ..shapes import ATTENTION_LAYOUTS, C4_BLOCK, C128_BLOCK, HEADS_PER_RANK, INDEX_TOPK, SWA_BLOCK, WINDOW

# ---------------------------------------------------------------------------------------------
# Conformance (the family's inputs and rule, dsv4ops/attention_family.py): cases, error inputs, bench shapes

def cases(tier: str):
    if tier == "quick":
        yield dict(T=0, H=4, topk=64, layout="fp8_ds_mla")
        for layout in ATTENTION_LAYOUTS:
            yield dict(T=3, H=5, topk=64, layout=layout, extra_topk=64, extra_block_size=C128_BLOCK)
        for corner in ("all_invalid", "pad_middle", "duplicates", "zero_len"):
            yield dict(T=3, H=8, topk=32, layout="fp8_ds_mla", extra_topk=64,
                       extra_block_size=16, corner=corner)
        yield dict(T=2, H=16, topk=64, layout="fp8_ds_mla", sink="inf", lens="full", out=True)
        yield dict(T=2, H=3, topk=32, layout="fp8_ds_mla", sink=None, lens=None)
        for layout in ("bf16", "fp8_per_tensor"):     # the SM100 TRTLLM-gen shape: 128 SWA + extra, no lse
            yield dict(T=3, H=8, topk=WINDOW, layout=layout, extra_topk=64, extra_block_size=C128_BLOCK,
                       need_lse=False)
        yield dict(T=3, H=16, topk=64, layout="fp8_ds_mla", extra_topk=64, extra_block_size=C128_BLOCK,
                   need_lse=False)
        yield dict(T=2, H=8, topk=32, layout="bf16", sink="inf", need_lse=False)   # single segment
        yield from grid_cases(tier, T=1)
        yield from v41_cases(tier, T=3, H=8)
        return
    for model, heads in HEADS_PER_RANK.items():
        for H, T in itertools.product(heads, (8, 128)):
            yield dict(T=T, H=H, topk=WINDOW, layout="fp8_ds_mla", block_size=SWA_BLOCK,
                       extra_topk=INDEX_TOPK[model], extra_block_size=C4_BLOCK)
        yield dict(T=64, H=heads[0], topk=WINDOW, layout="fp8_ds_mla", block_size=SWA_BLOCK,
                   extra_topk=128, extra_block_size=C128_BLOCK)           # C128 layer
        yield dict(T=32, H=heads[0], topk=WINDOW, layout="fp8_ds_mla", block_size=SWA_BLOCK)  # SWA only
    for layout in ("bf16", "fp8_per_tensor"):
        for need_lse in (True, False):
            yield dict(T=64, H=64, topk=WINDOW, layout=layout, block_size=SWA_BLOCK, extra_topk=512,
                       extra_block_size=C4_BLOCK, need_lse=need_lse)
    for corner in ("all_invalid", "pad_middle", "duplicates", "zero_len"):
        yield dict(T=16, H=64, topk=WINDOW, layout="fp8_ds_mla", block_size=SWA_BLOCK, extra_topk=512,
                   extra_block_size=C4_BLOCK, corner=corner)
    yield dict(T=16, H=128, topk=WINDOW, layout="fp8_ds_mla", block_size=SWA_BLOCK, extra_topk=1024,
               extra_block_size=C4_BLOCK, sink="inf", out=True)
    yield from grid_cases(tier, T=16)
    yield from v41_cases(tier, T=16, H=64)


def cost(kw: dict) -> tuple[int, int]:
    """(bytes, flops) a kernel must move / do at least."""
    layout = Layout.of(kw["layout"])
    rows = selected_entries(kw["indices"], kw.get("topk_lens"))
    moved = rows * layout.token_bytes
    if kw.get("extra_indices") is not None:
        extra = selected_entries(kw["extra_indices"], kw.get("extra_topk_lens"))
        rows += extra
        moved += extra * Layout.of(kw.get("extra_layout") or layout).token_bytes
    T, H, D = kw["q"].shape
    return moved + 2 * nbytes(kw["q"]) + T * H * 4, 4 * rows * H * D     # QK^T and PV


ERRORS = (
    ("q", change("q", lambda t: t.float())),
    ("q", change("q", lambda t: torch.zeros(3, 0, 512, dtype=torch.bfloat16))),
    ("indices", change("indices", lambda t: t.long())),
    ("indices", change("indices", lambda t: t[:2])),
    ("indices", change("indices", lambda t: torch.where(t == -1, -2, t))),
    ("indices", change("indices", lambda t: t.clamp_min(0) + 10_000)),
    ("topk_lens", change("topk_lens", lambda t: t + 100)),
    ("extra_topk_lens", change("extra_topk_lens", lambda t: t + 100)),
    ("attn_sink", change("attn_sink", lambda t: t[:2])),
    ("attn_sink", change("attn_sink", lambda t: t.double())),
    ("softmax_scale", set_args(softmax_scale="0.04")),
    ("extra_indices", set_args(extra_indices=None)),
    ("extra_kv_cache", set_args(extra_kv_cache=None)),
    ("extra_kv_cache", set_args(extra_block_size=4)),
    ("kv_cache", set_args(layout="bf16")),
    ("layout", set_args(layout="fp8")),
    ("layout", set_args(layout="nvfp4_v41", q=torch.zeros(3, 4, 512, dtype=torch.bfloat16))),
    ("extra_layout", set_args(extra_layout="nvfp4_v41")),                  # a V4 main layout
    ("extra_layout", set_args(extra_layout="bf16")),
    ("extra_layout", set_args(extra_layout="nvfp4")),
    ("extra_layout", set_args(layout="mxfp8_v41", extra_layout="fp8_ds_mla")),
    ("kv_cache", set_args(layout="mxfp8_v41", kv_cache=torch.zeros(8, 16 * 528 - 1, dtype=torch.uint8))),
    ("extra_kv_cache", set_args(layout="mxfp8_v41", extra_layout="nvfp4_v41",
                                extra_kv_cache=torch.zeros(32, 2 * 288 - 1, dtype=torch.uint8))),
    ("out", set_args(out=torch.empty(3, 4, 512))),
)

SPEC = OpSpec(
    name="sparse_mla_decode",
    section=2,
    doc="""Sparse MQA decode. q [T, H, 512] (bf16; fp8 for "fp8_per_tensor"), H <= 128; indices int32
    [T, topk] (block * block_size + offset, -1 invalid); topk_lens int32 [T]; attn_sink fp32 [H].
    Returns out bf16 [T, H, 512] and lse fp32 [T, H] (natural log, sink excluded, +inf if lonely);
    with ``need_lse=False`` the second element is None, which admits backends whose kernel does not
    produce the log-sum-exp (FlashInfer's TRTLLM-gen DSV4 decode).""",
    args=ARGS,
    outputs=OUTPUTS,
    check=check,
    fake=fake,
    reference="dsv4ops.reference.impl.sparse_mla_decode:sparse_mla_decode",
    conformance=Conformance(
        inputs=inputs,
        cases=cases,
        typical=dict(T=4, H=64, topk=WINDOW, layout="fp8_ds_mla", block_size=SWA_BLOCK, extra_topk=512,
                     extra_block_size=C4_BLOCK),
        compare=attention_rule(lambda kw: output_magnitude(OP, kw)),
        strides=STRIDES,
        stride_bases={
            "quick": (dict(T=3, H=5, topk=32, layout="fp8_ds_mla", block_size=16, extra_topk=32, extra_block_size=16,
                           out=True),),
            "full": (dict(T=32, H=64, topk=128, layout="fp8_ds_mla", block_size=64, extra_topk=512,
                          extra_block_size=64, out=True),),
        },
        error_base=dict(T=3, H=4, topk=16, layout="fp8_ds_mla", block_size=16, extra_topk=8, extra_block_size=2),
        errors=ERRORS,
    ),
    bench=BenchShapes(
        cost=cost,
        tiny=dict(T=1, H=8, topk=64, layout="fp8_ds_mla", extra_topk=64, extra_block_size=64),
        production=(
            dict(T=8, H=64, topk=128, layout="fp8_ds_mla", extra_topk=128, extra_block_size=64, lens="full"),
            dict(T=128, H=64, topk=128, layout="fp8_ds_mla", extra_topk=512, extra_block_size=64, lens="full"),
            dict(T=128, H=128, topk=128, layout="fp8_ds_mla", extra_topk=1024, extra_block_size=64, lens="full"),
            dict(T=512, H=64, topk=128, layout="fp8_ds_mla", extra_topk=512, extra_block_size=64, lens="full"),
            # V4.1 (528 B main, 288 B extra) at the 584 B shapes above: the per-token ratio in one run
            *(dict(T=T, H=64, topk=128, layout="mxfp8_v41", extra_layout="nvfp4_v41", extra_topk=512,
                   extra_block_size=64, lens="full") for T in (128, 512)),
            dict(T=128, H=64, topk=128, layout="mxfp8_v41_inline", extra_layout="nvfp4_v41_inline", extra_topk=512,
                 extra_block_size=64, lens="full"),
        ),
        sweep=tuple(dict(T=T, H=H, topk=128, layout="fp8_ds_mla", extra_topk=512, extra_block_size=64, lens="full")
                    for H in (16, 64, 128) for T in (1, 8, 32, 128, 512)),
    ),
)
OP = define(SPEC)
