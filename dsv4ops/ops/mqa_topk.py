"""Op 13 (docs/ops.md §13): the prefill indexer in one call, mqa_logits scores to top-k indices per
query row without the ``[T, S]`` logits buffer an engine would otherwise allocate."""
from __future__ import annotations
from typing import Optional

import torch
from torch import Tensor

from .. import formats
from ..checker import INT32_MAX, Checker
from ..cost import nbytes
from ..opspec import Arg, BenchShapes, Conformance, OpSpec, define
from ..sampling import change, set_args
from ..shapes import INDEX_HEADS, INDEX_TOPK, V41_INDEX_HEADS
from ..tolerance import Collector, Verdict, topk_selection
from . import mqa_logits as logits_op


def logits_args(a, out=None):
    """The mqa_logits call whose scores this call selects from (typed args)."""
    return logits_op.OP.Args(q=a.q, k=a.k, k_scale=a.k_scale, weights=a.weights, ks=a.ks, ke=a.ke, q_scale=a.q_scale, clean=False,
                             out=out)


def check(c: Checker, a):
    logits_op.check(c, logits_args(a))
    c.int_arg("topk", a.topk, minimum=1)
    if a.topk > INT32_MAX - a.k.shape[0]:
        c.fail("topk", f"must keep S + topk <= {INT32_MAX}, got topk={a.topk}")
    c.out_buffer(a.out, dtype=torch.int32, shape=(a.q.shape[0], a.topk))
    return a


def fake(a):
    return a.q.new_empty(a.q.shape[0], a.topk, dtype=torch.int32)


# ---------------------------------------------------------------------------------------------
# Conformance: sample inputs, cases, comparison rule, error inputs, bench shapes

def inputs(device, gen, *, topk, out=False, **logits_params):
    """mqa_logits' inputs (``logits_params``, without ``clean``) and ``topk``."""
    kwargs = logits_op.inputs(device, gen, **logits_params)
    del kwargs["clean"]
    T = kwargs["q"].shape[0]
    if out:
        kwargs["out"] = torch.empty(T, topk, dtype=torch.int32, device=device)
    return dict(kwargs, topk=topk)


def cases(tier: str):
    """mqa_logits' key ranges (causal, several requests, random; empty rows, full rows), topk below
    and above the range lengths."""
    if tier == "quick":
        yield dict(T=0, S=16, H=4, topk=8)
        yield dict(T=3, S=0, H=4, topk=8)
        for ranges in ("causal", "requests", "random"):
            yield dict(T=9, S=40, H=8, ranges=ranges, topk=8, out=ranges == "random")
        yield dict(T=8, S=40, H=8, ranges="random", corner="empty", topk=16)
        yield dict(T=6, S=33, H=5, corner="full", topk=64)                           # topk > S
        for q_fmt in ("fp8", "mxfp4"):                                               # V4.1: MXFP4 keys
            yield dict(T=9, S=40, H=V41_INDEX_HEADS, ranges="requests", keys="mxfp4", q_fmt=q_fmt, topk=8)
        return
    for topk in INDEX_TOPK.values():
        yield dict(T=4096, S=32768, H=INDEX_HEADS, ranges="causal", topk=topk)
        yield dict(T=2048, S=131072, H=INDEX_HEADS, ranges="requests", topk=topk)
    yield dict(T=2048, S=16384, H=INDEX_HEADS, ranges="random", corner="empty", topk=512)


def compare(params, ref_kwargs, ref_result, got_kwargs, got_result) -> Verdict:
    """indexer_topk's rule on the reference logits over [ks, ke), where a selected and an unselected
    key may swap when their logits differ by less than their two error bounds under mqa_logits'
    rule (1e-4 of sum_h |w_h| sum_d |q_hd| |k_d| each): docs/ops.md §13."""
    c = Collector()
    kw = ref_kwargs
    scores = logits_op.OP.reference(kw["q"], kw["k"], kw["k_scale"], kw["weights"], kw["ks"], kw["ke"],
                                    q_scale=kw.get("q_scale"))
    topk_selection(c, scores, kw["topk"], kw["ks"].to(torch.int64), kw["ke"].to(torch.int64), got_result,
                   1e-4 * logits_op.magnitude(kw), "indices")
    return c.verdict()


def cost(kw: dict) -> tuple[int, int]:
    """(bytes, flops): inputs read once, the indices written; a dot product per (row, key) in range."""
    (T, H), D = kw["q"].shape[:2], formats.INDEX_DIM
    pairs = int((kw["ke"].long() - kw["ks"].long()).sum())
    return nbytes(kw["q"], kw.get("q_scale"), kw["k"], kw["k_scale"], kw["weights"], kw["ks"], kw["ke"]) + T * kw["topk"] * 4, \
        2 * pairs * H * D


ERRORS = (
    ("q", change("q", lambda t: t.float())),
    ("q", change("q", lambda t: t[:, :0])),
    ("k", change("k", lambda t: t[:, :64].contiguous())),
    ("k_scale", change("k_scale", lambda t: t[:-1])),
    ("weights", change("weights", lambda t: t[:, :2])),
    ("ks", change("ks", lambda t: t - 1000)),
    ("ke", change("ke", lambda t: t + 1000)),
    ("topk", set_args(topk=0)),
    ("topk", set_args(topk=8.0)),
    ("topk", set_args(topk=INT32_MAX)),
    ("out", set_args(out=torch.empty(5, 8, dtype=torch.int64))),
    ("out", set_args(out=torch.empty(4, 8, dtype=torch.int32))),
)

SPEC = OpSpec(
    name="mqa_topk",
    section=13,
    doc="""The topk largest mqa_logits scores of each query row within its key range, as indices
    relative to ks: q fp8 [T, H, 128]; k fp8 [S, 128] with k_scale fp32 [S] (or MXFP4 q / keys as
    mqa_logits takes them); weights fp32 [T, H];
    ks, ke int32 [T]. Returns int32 [T, topk]: indexer_topk(mqa_logits(...), topk, row_starts=ks,
    row_ends=ke), without materializing the logits (backends bound their workspace).""",
    args=(
        *(arg for arg in logits_op.SPEC.args if arg.name not in ("q_scale", "clean", "out")),
        Arg("topk", int, doc="indices per row (>= 1); rows shorter than topk are padded with -1"),
        *(arg for arg in logits_op.SPEC.args if arg.name == "q_scale"),
        Arg("out", Optional[Tensor], None, keyword_only=True, mutated=True,
            doc="int32 [T, topk] contiguous, or None to allocate"),
    ),
    outputs="Tensor",
    check=check,
    fake=fake,
    reference="dsv4ops.reference.impl.mqa_topk:mqa_topk",
    composes=("mqa_logits", "indexer_topk"),
    conformance=Conformance(
        inputs=inputs,
        cases=cases,
        typical=dict(T=64, S=256, H=INDEX_HEADS, topk=64),
        compare=compare,
        strides=logits_op.SPEC.conformance.strides,
        stride_bases={"quick": (dict(T=9, S=40, H=8, ranges="random", topk=8, out=True),),
                      "full": (dict(T=1000, S=7777, H=INDEX_HEADS, ranges="requests", topk=512, out=True),)},
        error_base=dict(T=5, S=40, H=4, ranges="random", topk=8),
        errors=ERRORS,
    ),
    bench=BenchShapes(
        cost=cost,
        tiny=dict(T=4, S=64, H=64, topk=16),
        production=(dict(T=4096, S=32768, H=64, ranges="causal", topk=512),
                    dict(T=4096, S=131072, H=64, ranges="causal", topk=512)),
        matrix="fp8",
    ),
)
OP = define(SPEC)
