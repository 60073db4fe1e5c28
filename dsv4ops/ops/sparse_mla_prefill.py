"""docs/ops.md §10: sparse MQA prefill, the many-token counterpart of sparse_mla_decode.

Same arguments, checks and semantics as sparse_mla_decode (one index row per query token over the
SWA cache plus an optional compressed cache, attention sink, lonely-row rule); a separate op because
engines call a different kernel for prefill (compute-bound: thousands of tokens, 64 or 128 heads,
1K+ selected rows each) and backends differ per op (FlashMLA ``flash_mla_sparse_fwd`` over a
gathered bf16 workspace, AITER ``pa_prefill_sparse``).
"""
from __future__ import annotations

import torch

from ..attention_family import (ARGS, OUTPUTS, STRIDES, attention_rule, check, fake, grid_cases, inputs,
                                output_magnitude, v41_cases)
from ..cost import nbytes, selected_entries
from ..opspec import BenchShapes, Conformance, OpSpec, define
from ..sampling import change, set_args
from ..shapes import ATTENTION_LAYOUTS, C4_BLOCK, C128_BLOCK, HEADS_PER_RANK, INDEX_TOPK, SWA_BLOCK, WINDOW


def cases(tier: str):
    if tier == "quick":
        yield dict(T=0, H=4, topk=64, layout="fp8_ds_mla")
        for layout in ATTENTION_LAYOUTS:
            yield dict(T=3, H=16, topk=64, layout=layout, extra_topk=64, extra_block_size=C128_BLOCK)
        yield dict(T=2, H=64, topk=32, layout="fp8_ds_mla", extra_topk=64, extra_block_size=16)
        yield dict(T=2, H=20, topk=32, layout="bf16", extra_topk=32, extra_block_size=16)
        for corner in ("all_invalid", "pad_middle", "duplicates", "zero_len"):
            yield dict(T=3, H=16, topk=32, layout="fp8_ds_mla", extra_topk=64,
                       extra_block_size=16, corner=corner)
        yield dict(T=2, H=16, topk=64, layout="fp8_ds_mla", sink="inf", lens="full", out=True)
        yield dict(T=2, H=16, topk=32, layout="fp8_ds_mla", sink=None, lens=None)
        yield dict(T=3, H=16, topk=32, layout="bf16", extra_topk=64, extra_block_size=16,
                   need_lse=False)
        yield from grid_cases(tier, T=2)
        yield from v41_cases(tier, T=3, H=16)
        return
    for model, heads in HEADS_PER_RANK.items():
        extra = dict(topk=WINDOW, layout="fp8_ds_mla", block_size=SWA_BLOCK, extra_topk=INDEX_TOPK[model],
                     extra_block_size=C4_BLOCK)
        sizes = ((heads[0], 4096), (heads[0], 8192), (heads[1], 4096)) if model == "pro" else \
            ((heads[0], 4096), (heads[1], 4096))
        for H, T in sizes:
            yield dict(T=T, H=H, **extra)
        yield dict(T=2048, H=heads[0], topk=WINDOW, layout="fp8_ds_mla", block_size=SWA_BLOCK,
                   extra_topk=128, extra_block_size=C128_BLOCK)          # C128 layer
        yield dict(T=1024, H=heads[0], topk=WINDOW, layout="fp8_ds_mla", block_size=SWA_BLOCK)
    for layout in ("bf16", "fp8_per_tensor"):
        yield dict(T=1024, H=64, topk=WINDOW, layout=layout, block_size=SWA_BLOCK, extra_topk=512,
                   extra_block_size=C4_BLOCK)
    for corner in ("all_invalid", "pad_middle", "duplicates", "zero_len"):
        yield dict(T=512, H=128, topk=WINDOW, layout="fp8_ds_mla", block_size=SWA_BLOCK,
                   extra_topk=1024, extra_block_size=C4_BLOCK, corner=corner)
    yield dict(T=1024, H=128, topk=WINDOW, layout="fp8_ds_mla", block_size=SWA_BLOCK, extra_topk=1024,
               extra_block_size=C4_BLOCK, sink="inf", out=True)
    yield dict(T=1024, H=64, topk=WINDOW, layout="fp8_ds_mla", block_size=SWA_BLOCK, extra_topk=512,
               extra_block_size=C4_BLOCK, sink=None, need_lse=False)
    yield from grid_cases(tier, T=64)
    yield dict(T=512, H=64, topk=WINDOW, layout="fp8_ds_mla", block_size=SWA_BLOCK, extra_topk=1024,
               extra_block_size=C4_BLOCK, extra_slots=40960)              # a 40K-entry compressed cache
    yield from v41_cases(tier, T=512, H=64)


def cost(kw: dict) -> tuple[int, int]:
    """(bytes, flops) a kernel must move / do at least."""
    T, H, D = kw["q"].shape
    rows = selected_entries(kw["indices"], kw.get("topk_lens"))
    if kw.get("extra_indices") is not None:
        rows += selected_entries(kw["extra_indices"], kw.get("extra_topk_lens"))
    return nbytes(kw["kv_cache"], kw.get("extra_kv_cache")) + 2 * nbytes(kw["q"]) + T * H * 4, 4 * rows * H * D


ERRORS = (
    ("q", change("q", lambda t: t.float())),
    ("q", change("q", lambda t: torch.zeros(5, 129, 512, dtype=torch.bfloat16))),
    ("q", change("q", lambda t: t[..., :256].contiguous())),
    ("indices", change("indices", lambda t: t.long())),
    ("indices", change("indices", lambda t: t[:4])),
    ("indices", change("indices", lambda t: torch.where(t == -1, -7, t))),
    ("extra_indices", change("extra_indices", lambda t: t.clamp_min(0) + 1000)),
    ("topk_lens", change("topk_lens", lambda t: t - 100)),
    ("extra_topk_lens", change("extra_topk_lens", lambda t: t[:2])),
    ("attn_sink", change("attn_sink", lambda t: torch.full_like(t, float("nan")))),
    ("attn_sink", change("attn_sink", lambda t: t[:8])),
    ("softmax_scale", set_args(softmax_scale=0.0)),
    ("extra_indices", set_args(extra_indices=None)),
    ("extra_kv_cache", lambda kw: kw.update(extra_kv_cache=None, extra_indices=None, extra_topk_lens=None)),
    ("block_size", set_args(block_size=0)),
    ("out", set_args(out=torch.empty(5, 16, 512, dtype=torch.float16))),
    ("need_lse", set_args(need_lse="no")),
)

SPEC = OpSpec(
    name="sparse_mla_prefill",
    section=10,
    doc="""Sparse MQA prefill. q [T, H, 512] (bf16; fp8 for "fp8_per_tensor"), H <= 128; indices int32
    [T, topk] into kv_cache (block * block_size + offset, -1 invalid); topk_lens int32 [T]; the
    optional extra (compressed) cache with extra_indices [T, extra_topk]; attn_sink fp32 [H].
    Returns out bf16 [T, H, 512] and lse fp32 [T, H] (natural log, sink excluded, +inf if lonely);
    with ``need_lse=False`` the second element is None (AITER's pa_prefill_sparse has no lse).
    The caches are read in place: a backend that needs a gathered bf16 workspace builds it itself.""",
    args=ARGS,
    outputs=OUTPUTS,
    check=check,
    fake=fake,
    reference="dsv4ops.reference.impl.sparse_mla_prefill:sparse_mla_prefill",
    conformance=Conformance(
        inputs=inputs,
        cases=cases,
        typical=dict(T=64, H=64, topk=WINDOW, layout="fp8_ds_mla", block_size=SWA_BLOCK, extra_topk=512,
                     extra_block_size=C4_BLOCK),
        compare=attention_rule(lambda kw: output_magnitude(OP, kw)),
        strides=STRIDES,
        stride_bases={
            "quick": (dict(T=3, H=16, topk=32, layout="fp8_ds_mla", block_size=16, extra_topk=32, extra_block_size=16,
                           out=True),),
            "full": (dict(T=512, H=64, topk=128, layout="fp8_ds_mla", block_size=64, extra_topk=512,
                          extra_block_size=64, out=True),),
        },
        error_base=dict(T=5, H=16, topk=16, layout="fp8_ds_mla", block_size=16, extra_topk=8, extra_block_size=2),
        errors=ERRORS,
    ),
    bench=BenchShapes(
        cost=cost,
        tiny=dict(T=4, H=16, topk=64, layout="fp8_ds_mla", extra_topk=64, extra_block_size=64),
        production=(
            dict(T=4096, H=128, topk=128, layout="fp8_ds_mla", extra_topk=1024, extra_block_size=64,
                 extra_slots=32768, lens="full"),
            dict(T=4096, H=64, topk=128, layout="fp8_ds_mla", extra_topk=512, extra_block_size=64, extra_slots=32768,
                 lens="full"),
            dict(T=4096, H=64, topk=128, layout="mxfp8_v41", extra_layout="nvfp4_v41", extra_topk=512,
                 extra_block_size=64, extra_slots=32768, lens="full"),          # V4.1 next to the 584 B shape
        ),
        sweep=tuple(dict(T=T, H=H, topk=128, layout="fp8_ds_mla", extra_topk=1024 if H == 128 else 512,
                         extra_block_size=64, extra_slots=32768, lens="full")
                    for H in (64, 128) for T in (512, 2048, 8192)),
    ),
)
OP = define(SPEC)
