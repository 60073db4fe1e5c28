"""Op 14 (docs/ops.md §14): the two-level indexer's candidate blocks, chosen from the source layer's
logits: per row the best blocks of positions by their largest visible logit, ascending, -1 padded."""
from __future__ import annotations

import itertools
from typing import Optional

import torch
from torch import Tensor

from ..checker import INT32_MAX, Checker
from ..index_checks import check_row_lengths
from ..opspec import Arg, BenchShapes, Conformance, OpSpec, define
from ..sampling import change, randint, randn, row_ranges, set_args, to_device
from ..shapes import CANDIDATE_BLOCK, CANDIDATE_BLOCKS
from ..tolerance import Collector, Verdict


def check(c: Checker, a):
    c.tensor("logits", a.logits, dtype=torch.float32, shape=("R", "W"), anchor=True)
    R, W = a.logits.shape
    c.size_limit("logits", W, what="width W (int32 columns)")
    c.int_arg("sparse_block", a.sparse_block, minimum=1)
    c.int_arg("num_blocks", a.num_blocks, minimum=1)
    if a.num_blocks * a.sparse_block > INT32_MAX:
        c.fail("num_blocks", f"must keep num_blocks * sparse_block <= {INT32_MAX}, got {a.num_blocks} * "
                             f"{a.sparse_block}")
    check_row_lengths(c, a, R, W)
    return a


def fake(a):
    R = a.logits.shape[0]
    return (a.logits.new_empty(R, a.num_blocks, dtype=torch.int32), a.logits.new_empty(R, dtype=torch.int32))


# ---------------------------------------------------------------------------------------------
# Conformance: sample inputs, cases, comparison rule, error inputs, bench shapes

def inputs(device, gen, *, R, W, sparse_block=8, num_blocks=16, mode="ranges", next_n=1, data="random",
           corner=None, column_major=False):
    """``data``: "random", "ties" (integers 0-3: equal block scores everywhere), "neg_inf" (60 %
    -inf: whole blocks dropped), "nonfinite" (NaN and +inf inside rows); ``corner``: "empty" (every
    other row empty), "all_empty". Columns outside a row's range hold +inf, and NaN in every other
    one with "nonfinite" (a backend that reads them picks those blocks)."""
    logits = randn(gen, R, W)
    if data == "ties":
        logits = randint(gen, 0, 4, (R, W)).to(torch.float32)
    elif data == "neg_inf":
        logits[torch.rand(R, W, generator=gen) < 0.6] = float("-inf")
    elif data == "nonfinite":
        odd = torch.rand(R, W, generator=gen)
        logits[odd < 0.02] = float("nan")
        logits[(odd >= 0.02) & (odd < 0.04)] = float("inf")
        logits[(odd >= 0.04) & (odd < 0.06)] = -0.0
    ranges, outside = row_ranges(gen, R, W, mode, next_n, corner)
    kwargs = dict(logits=logits, sparse_block=sparse_block, num_blocks=num_blocks, **ranges)
    logits[outside] = float("inf")
    if data == "nonfinite":
        logits[outside & (torch.arange(W) % 2 == 0)] = float("nan")
    if column_major:
        kwargs["logits"] = logits.t().contiguous().t()
    return to_device(kwargs, device)


def cases(tier: str):
    """Every form and data family; rows with fewer blocks than num_blocks and with many more; block
    sizes that do not divide the width; empty rows; next_n up to 8."""
    if tier == "quick":
        yield dict(R=0, W=64)
        yield dict(R=4, W=0, mode="decode2d", next_n=2)
        for mode, data in itertools.product(("ranges", "decode1d", "decode2d"), ("random", "ties", "neg_inf",
                                                                                 "nonfinite")):
            yield dict(R=6, W=300, num_blocks=12, mode=mode, next_n=1 if mode == "ranges" else 2, data=data)
        yield dict(R=4, W=100, sparse_block=16, num_blocks=64)                  # every block fits
        yield dict(R=4, W=203, sparse_block=5, num_blocks=8, data="ties")        # partial last block
        yield dict(R=5, W=96, sparse_block=1, num_blocks=20, data="ties")        # blocks of one position
        yield dict(R=4, W=128, mode="decode1d", next_n=2, corner="empty")
        yield dict(R=4, W=128, mode="ranges", corner="all_empty", data="nonfinite")
        for mode in ("decode1d", "decode2d"):
            yield dict(R=16, W=120, num_blocks=4, mode=mode, next_n=8)
        yield dict(R=5, W=200, mode="ranges", column_major=True)
        return
    for R, W in ((128, 16384), (128, 131072), (32, 32768)):
        yield dict(R=R, W=W, sparse_block=CANDIDATE_BLOCK, num_blocks=CANDIDATE_BLOCKS, mode="decode2d")
    for data in ("ties", "neg_inf", "nonfinite"):
        yield dict(R=64, W=32768, sparse_block=CANDIDATE_BLOCK, num_blocks=CANDIDATE_BLOCKS, data=data)
    yield dict(R=4096, W=32768, sparse_block=CANDIDATE_BLOCK, num_blocks=CANDIDATE_BLOCKS, mode="ranges")
    for next_n in range(2, 9):
        yield dict(R=16 * next_n, W=16384, sparse_block=CANDIDATE_BLOCK, num_blocks=CANDIDATE_BLOCKS,
                   mode="decode1d", next_n=next_n)
    yield dict(R=64, W=8192, sparse_block=16, num_blocks=4096, mode="decode2d", corner="empty")


def compare(params, ref_kwargs, ref_result, got_kwargs, got_result) -> Verdict:
    """Exact: the selection has no arithmetic (block maxima of the given logits, a total order with
    ties to the lower block), so both outputs must equal the reference's."""
    c = Collector()
    for name, got, ref in zip(("blocks", "counts"), got_result, ref_result):
        same = got.dtype == ref.dtype and got.shape == ref.shape and torch.equal(got.cpu(), ref.cpu())
        c.require(same, f"{name} differ from the reference" + (
            f" in {int((got.cpu() != ref.cpu()).any(-1).sum()) if got.dim() > 1 else int((got.cpu() != ref.cpu()).sum())} rows"
            if got.shape == ref.shape and got.dtype == ref.dtype else f": {got.dtype} {list(got.shape)}"))
    return c.verdict()


def cost(kw: dict) -> tuple[int, int]:
    """(bytes, flops): the logits read once, the blocks written."""
    R, W = kw["logits"].shape
    return R * W * 4 + R * (kw["num_blocks"] + 1) * 4, 0


ERRORS = (
    ("logits", change("logits", lambda t: t.double())),
    ("logits", change("logits", lambda t: t[0])),
    ("sparse_block", set_args(sparse_block=0)),
    ("num_blocks", set_args(num_blocks=0)),
    ("num_blocks", set_args(num_blocks=8.0)),
    ("num_blocks", set_args(num_blocks=2 ** 30)),
    ("row_ends", set_args(row_ends=None)),
    ("row_starts", change("row_starts", lambda t: t.long())),
    ("row_ends", change("row_ends", lambda t: t + 1000)),
    ("row_starts", lambda kw: kw.update(row_starts=torch.full_like(kw["row_starts"], 9),
                                        row_ends=torch.full_like(kw["row_ends"], 5))),
    ("seq_lens", lambda kw: kw.update(row_starts=None, row_ends=None, seq_lens=torch.ones(3, dtype=torch.int32))),
    ("next_n", lambda kw: kw.update(row_starts=None, row_ends=None, next_n=3,
                                    seq_lens=torch.ones(2, 2, dtype=torch.int32))),
    ("next_n", set_args(next_n=0)),
)

SPEC = OpSpec(
    name="candidate_blocks",
    section=14,
    doc="""logits fp32 [R, W] (any strides) with rows [row_starts, row_ends) (int32 [R]) or decode
    lengths ``seq_lens`` int32 [B] (with next_n) / [B, next_n]. Returns (blocks int32 [R, num_blocks],
    counts int32 [R]): per row the row-local indices of the ``counts`` best blocks of ``sparse_block``
    positions (score: the largest visible logit, NaN first; the block of the newest position always
    kept; -inf blocks dropped; ties to the lower block), ascending, then -1.""",
    args=(
        Arg("logits", Tensor, doc="fp32 [R, W] (any strides), the candidate-source layer's logits"),
        Arg("sparse_block", int, doc="positions per block (>= 1; V4.1: 8)"),
        Arg("num_blocks", int, doc="blocks kept per row at most (>= 1; V4.1: 2048)"),
        Arg("row_starts", Optional[Tensor], None, keyword_only=True,
            doc="int32 [R], first visible column per row (with row_ends)"),
        Arg("row_ends", Optional[Tensor], None, keyword_only=True,
            doc="int32 [R], end of the visible columns per row (with row_starts)"),
        Arg("seq_lens", Optional[Tensor], None, keyword_only=True,
            doc="int32 [B] (causal MTP rule) or [B, next_n], the decode form instead of row ranges"),
        Arg("next_n", int, 1, keyword_only=True, doc="rows per request in the decode form (R = B * next_n)"),
    ),
    outputs="(Tensor, Tensor)",
    check=check,
    fake=fake,
    reference="dsv4ops.reference.impl.candidate_blocks:candidate_blocks",
    conformance=Conformance(
        inputs=inputs,
        cases=cases,
        typical=dict(R=4, W=4096, num_blocks=256, mode="decode2d"),
        compare=compare,
        strides={"logits": ("transposed", "sliced"), "row_starts": ("sliced",), "row_ends": ("sliced",),
                 "seq_lens": ("sliced", "transposed")},
        stride_bases={
            "quick": (dict(R=6, W=300, num_blocks=12, mode="ranges"),
                      dict(R=6, W=300, num_blocks=12, mode="decode2d", next_n=2)),
            "full": (dict(R=64, W=16384, num_blocks=CANDIDATE_BLOCKS, mode="ranges"),
                     dict(R=64, W=16384, num_blocks=CANDIDATE_BLOCKS, mode="decode2d", next_n=2)),
        },
        error_base=dict(R=4, W=64, num_blocks=4, mode="ranges"),
        errors=ERRORS,
    ),
    bench=BenchShapes(
        cost=cost,
        tiny=dict(R=4, W=256, num_blocks=16, mode="decode2d"),
        production=(dict(R=128, W=32768, num_blocks=CANDIDATE_BLOCKS, mode="decode2d"),
                    dict(R=4096, W=32768, num_blocks=CANDIDATE_BLOCKS, mode="ranges")),
        sweep=tuple(dict(R=R, W=W, num_blocks=CANDIDATE_BLOCKS, mode="decode2d") for R in (16, 128)
                    for W in (16384, 32768, 131072)),
        matrix="bf16",
    ),
)
OP = define(SPEC)
