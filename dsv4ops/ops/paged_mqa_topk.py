"""Op 12 (docs/ops.md §12): the decode indexer in one call, paged logits to top-k indices without
the ``[rows, max_context_len]`` logits buffer an engine would otherwise allocate."""
from __future__ import annotations
from typing import Optional

import torch
from torch import Tensor

from .. import formats
from ..checker import INT32_MAX, Checker
from ..cost import nbytes
from ..opspec import Arg, BenchShapes, Conformance, OpSpec, define
from ..rows import decode_row_ends
from ..sampling import change, set_args
from ..shapes import C4_BLOCK, INDEX_HEADS, INDEX_TOPK, V41_INDEX_HEADS
from ..tolerance import Collector, Verdict, topk_selection
from . import paged_mqa_logits as logits_op


def logits_args(a, out=None):
    """The paged_mqa_logits call whose scores this call selects from (typed args)."""
    return logits_op.OP.Args(q=a.q, kv_cache=a.kv_cache, weights=a.weights, context_lens=a.context_lens,
                             block_table=a.block_table, max_context_len=a.max_context_len, q_scale=a.q_scale,
                             clean=False, out=out)


def check(c: Checker, a):
    logits_op.check(c, logits_args(a))
    c.int_arg("topk", a.topk, minimum=1)
    if a.topk > INT32_MAX - a.max_context_len:
        c.fail("topk", f"must keep max_context_len + topk <= {INT32_MAX}, got topk={a.topk}")
    c.out_buffer(a.out, dtype=torch.int32, shape=(a.q.shape[0] * a.q.shape[1], a.topk))
    return a


def fake(a):
    return a.q.new_empty(a.q.shape[0] * a.q.shape[1], a.topk, dtype=torch.int32)


# ---------------------------------------------------------------------------------------------
# Conformance: sample inputs, cases, comparison rule, error inputs, bench shapes

def inputs(device, gen, *, topk, out=False, **logits_params):
    """paged_mqa_logits' inputs (``logits_params``, without ``clean``) and ``topk``."""
    kwargs = logits_op.inputs(device, gen, **logits_params)
    del kwargs["clean"]
    rows = kwargs["q"].shape[0] * kwargs["q"].shape[1]
    if out:
        kwargs["out"] = torch.empty(rows, topk, dtype=torch.int32, device=device)
    return dict(kwargs, topk=topk)


def cases(tier: str):
    """The logits cases' shapes and corners (lengths shorter than next_n, zero, all zero; padded MTP
    rows; next_n up to 8), with topk below and above the lengths."""
    if tier == "quick":
        yield dict(B=0, next_n=1, context=16, H=4, block_size=16, topk=8)
        for next_n, lens_dim in ((1, 1), (2, 1), (2, 2), (5, 2), (8, 1)):
            yield dict(B=3, next_n=next_n, context=40, H=8, block_size=16, lens_dim=lens_dim, topk=16, out=next_n == 2)
        yield dict(B=2, next_n=1, context=24, H=8, block_size=16, topk=64)                # k > every length
        for corner in ("zero_len", "short", "padded_rows", "all_zero_len"):
            yield dict(B=3, next_n=2, context=24, H=8, block_size=16, corner=corner, topk=8)
        for q_fmt in ("fp8", "mxfp4"):                                    # V4.1: MXFP4 keys, 32 heads
            yield dict(B=3, next_n=3, context=40, H=V41_INDEX_HEADS, block_size=16, layout="index_mxfp4",
                       q_fmt=q_fmt, topk=16)
        return
    for B, next_n, context in ((128, 1, 8192), (64, 2, 8192), (16, 4, 32768), (8, 1, 131072)):
        for topk in INDEX_TOPK.values():
            yield dict(B=B, next_n=next_n, context=context, H=INDEX_HEADS, block_size=C4_BLOCK, lens_dim=1, topk=topk)
    for corner in ("zero_len", "short", "all_zero_len"):
        yield dict(B=8, next_n=2, context=1024, H=INDEX_HEADS, block_size=C4_BLOCK, corner=corner, topk=512)


def compare(params, ref_kwargs, ref_result, got_kwargs, got_result) -> Verdict:
    """indexer_topk's rule on the reference logits, where a selected and an unselected key may swap
    when their logits differ by less than their two error bounds under paged_mqa_logits' rule
    (1e-4 of sum_h |w_h| sum_d |q_hd| |k_d| each): docs/ops.md §12."""
    c = Collector()
    kw = ref_kwargs
    scores = logits_op.OP.reference(kw["q"], kw["kv_cache"], kw["weights"], kw["context_lens"], kw["block_table"],
                                    kw["max_context_len"], q_scale=kw.get("q_scale"))
    ends = decode_row_ends(kw["context_lens"], kw["q"].shape[1])
    topk_selection(c, scores, kw["topk"], torch.zeros_like(ends), ends, got_result, 1e-4 * logits_op.magnitude(kw),
                   "indices")
    return c.verdict()


def cost(kw: dict) -> tuple[int, int]:
    """(bytes, flops): every valid key read once, q and weights once, the indices written."""
    B, n, H = kw["q"].shape[:3]
    D = formats.INDEX_DIM
    keys = int(kw["context_lens"].reshape(B, -1).amax(1).long().sum())
    moved = keys * kw["kv_cache"].shape[-1] + nbytes(kw["q"], kw.get("q_scale"), kw["weights"]) + B * n * kw["topk"] * 4
    return moved, 2 * n * H * D * keys


ERRORS = (
    ("q", change("q", lambda t: t.float())),
    ("kv_cache", change("kv_cache", lambda t: t[..., :128].contiguous())),
    ("weights", change("weights", lambda t: t[:1])),
    ("context_lens", change("context_lens", lambda t: t + 1000)),
    ("context_lens", change("context_lens", lambda t: t - 1000)),
    ("block_table", change("block_table", lambda t: t + 1000)),
    ("max_context_len", set_args(max_context_len=-1)),
    ("topk", set_args(topk=0)),
    ("topk", set_args(topk=8.0)),
    ("topk", set_args(topk=INT32_MAX)),
    ("out", set_args(out=torch.empty(4, 8, dtype=torch.int64))),
    ("out", set_args(out=torch.empty(3, 8, dtype=torch.int32))),
)

SPEC = OpSpec(
    name="paged_mqa_topk",
    section=12,
    doc="""The topk largest paged_mqa_logits scores of each decode row, as row-local indices: q fp8
    [B, next_n, H, 128] (or MXFP4 with q_scale, as paged_mqa_logits takes it); kv_cache uint8
    [num_blocks, block_size, 1, 132 or 68]; weights fp32 [B * next_n,
    H]; context_lens int32 [B] (causal MTP rule) or [B, next_n]; block_table int32 [B, max_blocks].
    Returns int32 [B * next_n, topk]: indexer_topk(paged_mqa_logits(...), topk, seq_lens=context_lens,
    next_n=next_n), without materializing the logits (backends bound their workspace).""",
    args=(
        *(arg for arg in logits_op.SPEC.args if arg.name not in ("q_scale", "clean", "out")),
        Arg("topk", int, doc="indices per row (>= 1); rows shorter than topk are padded with -1"),
        *(arg for arg in logits_op.SPEC.args if arg.name == "q_scale"),
        Arg("out", Optional[Tensor], None, keyword_only=True, mutated=True,
            doc="int32 [B * next_n, topk] contiguous, or None to allocate"),
    ),
    outputs="Tensor",
    check=check,
    fake=fake,
    reference="dsv4ops.reference.impl.paged_mqa_topk:paged_mqa_topk",
    composes=("paged_mqa_logits", "indexer_topk"),
    conformance=Conformance(
        inputs=inputs,
        cases=cases,
        typical=dict(B=2, next_n=1, context=256, H=INDEX_HEADS, block_size=C4_BLOCK, topk=64),
        compare=compare,
        strides=logits_op.SPEC.conformance.strides,
        stride_bases={"quick": (dict(B=3, next_n=3, context=40, H=4, block_size=16, lens_dim=2, topk=16, out=True),),
                      "full": (dict(B=8, next_n=2, context=2048, H=64, block_size=64, lens_dim=2, topk=512,
                                    out=True),)},
        error_base=dict(B=2, next_n=2, context=32, H=4, block_size=16, topk=8),
        errors=ERRORS,
    ),
    bench=BenchShapes(
        cost=cost,
        tiny=dict(B=1, next_n=1, context=64, H=64, block_size=64, topk=16),
        production=(dict(B=128, next_n=1, context=8192, H=64, block_size=64, topk=512),
                    dict(B=128, next_n=1, context=131072, H=64, block_size=64, topk=512)),
        sweep=tuple(dict(B=B, next_n=1, context=ctx, H=64, block_size=64, topk=512) for B in (8, 128)
                    for ctx in (2048, 8192, 32768, 131072)),    # the logits and top-k sweeps' shapes
        matrix="fp8",
    ),
)
OP = define(SPEC)
