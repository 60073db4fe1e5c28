"""Op 5 (docs/ops.md §5): per-row top-k of indexer logits, row-local indices, -1 padded."""
from __future__ import annotations

import itertools
from typing import Optional

import torch
from torch import Tensor

from ..checker import INT32_MAX, Checker
from ..index_checks import check_row_lengths
from ..opspec import Arg, BenchShapes, Conformance, OpSpec, define
from ..rows import row_bounds
from ..sampling import change, randint, randn, row_ranges, set_args, to_device
from ..shapes import INDEX_TOPK
from ..tolerance import Collector, Verdict, topk_selection

PLATEAU = 2048                  # equal keys around rank k in the "plateau" data family


def check(c: Checker, a):
    c.tensor("logits", a.logits, dtype=torch.float32, shape=("R", "W"), anchor=True)
    R, W = a.logits.shape
    c.size_limit("logits", W, what="width W (row-local indices are int32)")
    c.int_arg("k", a.k, minimum=1)
    if a.k > INT32_MAX - W:
        c.fail("k", f"must keep W + k <= {INT32_MAX} (int32 candidate columns), got k={a.k} with W={W}")
    check_row_lengths(c, a, R, W)
    c.out_buffer(a.out, dtype=torch.int32, shape=(R, a.k))
    return a


def fake(a):
    return a.logits.new_empty(a.logits.shape[0], a.k, dtype=torch.int32)


# ---------------------------------------------------------------------------------------------
# Conformance: sample inputs, cases, comparison rule, error inputs, bench shapes

def inputs(device, gen, *, R, W, k, mode="ranges", next_n=1, data="random", corner=None, out=False,
           column_major=False):
    """``data``: "random", "ties" (integers 0-5), "neg_inf" (half -inf), "heavy_tail", "bf16"
    (bf16-rounded), "plateau" (up to 2048 equal keys straddling rank k), "nonfinite" (NaN and +inf
    inside the rows, NaN / +inf garbage past their ends); ``corner``: "empty" (every other row
    empty), "all_empty" (every row). Columns outside a row's range hold +inf (a backend that ignores
    the range picks them)."""
    logits = randn(gen, R, W)
    if data == "ties":
        logits = randint(gen, 0, 6, (R, W)).to(torch.float32)
    elif data == "neg_inf":
        logits[torch.rand(R, W, generator=gen) < 0.5] = float("-inf")
    elif data == "heavy_tail":                  # log-normal: the top spans many binades
        logits = torch.exp(logits * 3)
    elif data == "bf16":                        # 8 significant bits: long runs of equal values
        logits = logits.to(torch.bfloat16).to(torch.float32)
    elif data == "plateau":                     # k - P/2 keys above a run of P equal keys
        above = max(0, k - PLATEAU // 2)
        run = min(PLATEAU, max(W - above, 0))
        order = torch.stack([torch.randperm(W, generator=gen) for _ in range(R)]) if R else torch.empty(0, W).long()
        logits.scatter_(1, order[:, :above], 10 + torch.rand(R, above, generator=gen))
        logits.scatter_(1, order[:, above:above + run], torch.full((R, run), 5.0))
    elif data == "nonfinite":
        odd = torch.rand(R, W, generator=gen)
        logits[odd < 0.05] = float("nan")
        logits[(odd >= 0.05) & (odd < 0.1)] = float("inf")
    ranges, outside = row_ranges(gen, R, W, mode, next_n, corner)
    kwargs = dict(logits=logits, k=k, **ranges)
    logits[outside] = float("inf")              # a backend that ignores the range picks these
    if data == "nonfinite":                     # garbage past the ends: NaN in every other column
        logits[outside & (torch.arange(W) % 2 == 0)] = float("nan")
    if column_major:                            # the op accepts any strides
        kwargs["logits"] = logits.t().contiguous().t()
    if out:
        kwargs["out"] = torch.empty(R, k, dtype=torch.int32)
    return to_device(kwargs, device)


def cases(tier: str):
    """Both tiers: every form and data family, ties and plateaus at the threshold, non-finite values
    inside rows and garbage past their ends, empty and all-empty rows, next_n up to 8, k > W."""
    if tier == "quick":
        yield dict(R=0, W=64, k=16)
        yield dict(R=4, W=0, k=16, mode="decode2d", next_n=2)                # no column: all -1
        for mode, data in itertools.product(("ranges", "decode1d", "decode2d"), ("random", "ties", "neg_inf")):
            yield dict(R=6, W=300, k=64, mode=mode, next_n=2 if mode != "ranges" else 1, data=data,
                       out=data == "ties")
        for data in ("heavy_tail", "bf16", "plateau", "nonfinite"):
            yield dict(R=4, W=300, k=64, mode="ranges", data=data)
        yield dict(R=4, W=600, k=128, mode="decode2d", data="plateau")
        yield dict(R=4, W=50, k=64, mode="ranges", corner="empty")         # k > W
        yield dict(R=4, W=128, k=32, mode="decode1d", next_n=2, corner="empty")
        yield dict(R=4, W=128, k=32, mode="decode2d", next_n=2, corner="all_empty", data="nonfinite")
        for mode, next_n in (("decode1d", 8), ("decode2d", 8), ("decode1d", 5)):    # DSpark verify widths
            yield dict(R=2 * next_n, W=100, k=16, mode=mode, next_n=next_n)
        yield dict(R=5, W=200, k=16, mode="ranges", column_major=True)
        yield dict(R=2, W=16384, k=64, mode="decode2d")      # GPU tunables: the threshold path (compile-only)
        return
    for model, k in INDEX_TOPK.items():
        for mode, next_n in (("decode2d", 1), ("decode2d", 2), ("decode1d", 2), ("ranges", 1)):
            yield dict(R=128, W=32768, k=k, mode=mode, next_n=next_n)
        for data in ("ties", "heavy_tail", "bf16", "plateau", "nonfinite"):
            yield dict(R=64, W=8192, k=k, mode="decode2d", data=data)
        yield dict(R=64, W=4096, k=k, mode="ranges", data="neg_inf", corner="empty")
    for data in ("random", "ties", "bf16", "plateau"):                  # the largest k users run
        yield dict(R=32, W=32768, k=2048, mode="ranges", data=data)
    for next_n in range(3, 9):
        yield dict(R=16 * next_n, W=16384, k=512, mode="decode1d", next_n=next_n)
    yield dict(R=64, W=8192, k=512, mode="decode2d", next_n=2, corner="all_empty", data="nonfinite")
    yield dict(R=32, W=700, k=1024, mode="ranges")                       # k > W


def compare(params, ref_kwargs, ref_result, got_kwargs, got_result) -> Verdict:
    """Sets, not order: each row holds min(k, n) distinct valid row-local columns, then -1; any
    difference from the reference's set must be a tie (min(selected) >= max(unselected valid))."""
    c = Collector()
    starts, ends = row_bounds(ref_kwargs.get("row_starts"), ref_kwargs.get("row_ends"), ref_kwargs.get("seq_lens"),
                              ref_kwargs.get("next_n", 1))
    topk_selection(c, ref_kwargs["logits"], ref_kwargs["k"], starts, ends, got_result, None, "indices")
    return c.verdict()


def cost(kw: dict) -> tuple[int, int]:
    """(bytes, flops) a kernel must move / do at least."""
    R, W = kw["logits"].shape
    return R * W * 4 + R * kw["k"] * 4, 0


ERRORS = (
    ("logits", change("logits", lambda t: t.double())),
    ("logits", change("logits", lambda t: t[0])),
    ("k", set_args(k=0)),
    ("k", set_args(k=8.0)),
    ("row_ends", set_args(row_ends=None)),
    ("row_starts", change("row_starts", lambda t: t.long())),
    ("row_ends", change("row_ends", lambda t: t + 1000)),
    ("row_starts", change("row_starts", lambda t: t - 1000)),
    ("row_starts", lambda kw: kw.update(row_starts=torch.full_like(kw["row_starts"], 9),
                                        row_ends=torch.full_like(kw["row_ends"], 5))),
    ("seq_lens", set_args(seq_lens=torch.tensor([3, 4], dtype=torch.int32))),
    ("seq_lens", lambda kw: kw.update(row_starts=None, row_ends=None, seq_lens=torch.ones(3, dtype=torch.int32))),
    ("next_n", lambda kw: kw.update(row_starts=None, row_ends=None, next_n=3,
                                    seq_lens=torch.ones(2, 2, dtype=torch.int32))),
    ("next_n", set_args(next_n=0)),
    ("out", set_args(out=torch.empty(4, 8, dtype=torch.int64))),
)

SPEC = OpSpec(
    name="indexer_topk",
    section=5,
    doc="""logits fp32 [R, W]; rows either [row_starts, row_ends) (int32 [R]) or decode lengths
    ``seq_lens`` int32 [B] (with next_n) / [B, next_n]; inputs of any strides. Returns int32 [R, k]:
    row-local columns of the k largest valid logits (order unspecified), -1 past the row's valid count.""",
    args=(
        Arg("logits", Tensor, doc="fp32 [R, W] (any strides)"),
        Arg("k", int, doc="indices per row (>= 1)"),
        Arg("row_starts", Optional[Tensor], None, keyword_only=True,
            doc="int32 [R], first valid column per row (with row_ends)"),
        Arg("row_ends", Optional[Tensor], None, keyword_only=True,
            doc="int32 [R], end of the valid columns per row (with row_starts)"),
        Arg("seq_lens", Optional[Tensor], None, keyword_only=True,
            doc="int32 [B] (causal MTP rule) or [B, next_n], the decode form instead of row ranges"),
        Arg("next_n", int, 1, keyword_only=True, doc="rows per request in the decode form (R = B * next_n)"),
        Arg("out", Optional[Tensor], None, keyword_only=True, mutated=True,
            doc="int32 [R, k] contiguous, or None to allocate"),
    ),
    outputs="Tensor",
    check=check,
    fake=fake,
    reference="dsv4ops.reference.impl.indexer_topk:indexer_topk",
    conformance=Conformance(
        inputs=inputs,
        cases=cases,
        typical=dict(R=4, W=1024, k=512, mode="decode2d"),
        compare=compare,
        strides={"logits": ("transposed", "sliced"), "row_starts": ("sliced",), "row_ends": ("sliced",),
                     "seq_lens": ("sliced", "transposed")},
        stride_bases={
            "quick": (dict(R=6, W=300, k=16, mode="ranges", out=True),
                      dict(R=6, W=300, k=16, mode="decode2d", next_n=2)),
            "full": (dict(R=64, W=8192, k=512, mode="ranges", out=True),
                     dict(R=64, W=8192, k=512, mode="decode2d", next_n=2)),
        },
        error_base=dict(R=4, W=64, k=8, mode="ranges"),
        errors=ERRORS,
    ),
    bench=BenchShapes(
        cost=cost,
        tiny=dict(R=4, W=128, k=16, mode="decode2d"),
        production=(dict(R=128, W=32768, k=512, mode="decode2d"), dict(R=128, W=32768, k=1024, mode="decode2d")),
        sweep=tuple(dict(R=R, W=W, k=512, mode="decode2d") for R in (4, 16, 64, 128)
                    for W in (8192, 32768, 65536, 131072)),
    ),
)
OP = define(SPEC)
