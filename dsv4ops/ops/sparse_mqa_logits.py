"""Op 16 (docs/ops.md §16): the two-level indexer's consumer logits, prefill form: mqa_logits
restricted to each row's candidate blocks (relative to its ks), laid out block after block."""
from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor

from .. import formats
from ..checker import Checker
from ..index_checks import check_blocks
from ..cost import nbytes
from ..opspec import Arg, BenchShapes, Conformance, OpSpec, define
from ..rows import candidate_columns
from ..sampling import FP8_NAN, change, random_blocks, set_args, to_device
from ..shapes import CANDIDATE_BLOCK, CANDIDATE_BLOCKS, V41_INDEX_HEADS
from ..tolerance import Collector, Verdict, fp8_abs, indexer_logits_rule
from . import mqa_logits as dense_op


def check(c: Checker, a):
    c.tensor("q", a.q, dtype=torch.float8_e4m3fn, shape=("T", "H", formats.INDEX_DIM), anchor=True, contiguous=True)
    T, H = a.q.shape[:2]
    if H < 1:
        c.fail("q", f"must have at least one head, got H={H}")
    c.tensor("k", a.k, dtype=a.q.dtype, shape=("S", formats.INDEX_DIM), contiguous=True)
    S = a.k.shape[0]
    c.tensor("k_scale", a.k_scale, dtype=torch.float32, shape=(S,), contiguous=True)
    c.tensor("weights", a.weights, dtype=torch.float32, shape=(T, H))
    c.tensor("ks", a.ks, dtype=torch.int32, shape=(T,))
    c.tensor("ke", a.ke, dtype=torch.int32, shape=(T,))
    c.bool_arg("clean", a.clean)
    c.in_range("ks", a.ks, 0, S + 1, what=f"range starts (at most the key count S={S})")
    c.in_range("ke", a.ke, 0, S + 1, what=f"range ends (at most the key count S={S})")
    c.not_above("ks", a.ks, "ke", a.ke)
    lens = (a.ke - a.ks) if c.values_checked(a.ks) else None
    width = check_blocks(c, a, T, lens)
    c.out_buffer(a.out, dtype=torch.float32, shape=(T, width))
    if T and S and c.values_checked(a.k_scale):            # the scales of the keys some candidate covers
        pos = candidate_columns(a.blocks, a.sparse_block)
        live = (pos >= 0) & (pos < lens[:, None])
        keys = (a.ks.to(torch.int64)[:, None] + pos)[live]
        c.finite_positive("k_scale", a.k_scale[keys], what="scales of the keys some row's candidate blocks cover")
    return a


def fake(a):
    return a.q.new_empty(a.q.shape[0], a.blocks.shape[1] * a.sparse_block, dtype=torch.float32)


# ---------------------------------------------------------------------------------------------
# Conformance: mqa_logits' inputs plus candidate blocks; keys no candidate covers are NaN

def inputs(device, gen, *, T, S, H=V41_INDEX_HEADS, ranges="causal", sparse_block=8, num_blocks=4, scale_fmt="fp32",
           clean=False, corner=None, out=False):
    kw = dense_op.inputs("cpu", gen, T=T, S=S, H=H, ranges=ranges, scale_fmt=scale_fmt, corner=corner)
    del kw["q_scale"]                          # fp8 queries only (the dense form's MXFP4 q is not taken)
    ks, ke = kw["ks"].long(), kw["ke"].long()
    blocks = random_blocks(gen, ke - ks, num_blocks, sparse_block, newest=corner != "no_newest")
    pos = candidate_columns(blocks, sparse_block)
    covered = torch.zeros(S + 1, dtype=torch.bool)
    covered[torch.where(pos >= 0, ks[:, None] + pos, S).clamp(max=S).reshape(-1)] = True
    kw["k"].view(torch.uint8)[~covered[:S]] = FP8_NAN["ocp"]
    kw["k_scale"][~covered[:S]] = float("nan")
    kw.update(blocks=blocks, sparse_block=sparse_block, clean=clean)
    if out:
        kw["out"] = torch.empty(T, num_blocks * sparse_block)
    return to_device(kw, device)


def cases(tier: str):
    if tier == "quick":
        yield dict(T=0, S=16, H=4)
        yield dict(T=3, S=0, H=4, clean=True)
        for ranges, clean in (("causal", False), ("causal", True), ("requests", True), ("random", False)):
            yield dict(T=9, S=72, H=8, ranges=ranges, clean=clean, scale_fmt="ue8m0" if clean else "fp32",
                       out=ranges == "random")
        yield dict(T=4, S=48, H=V41_INDEX_HEADS, num_blocks=8, clean=True)                  # every block fits
        yield dict(T=6, S=50, H=5, sparse_block=3, num_blocks=5, ranges="random", clean=True)
        yield dict(T=8, S=40, H=8, ranges="random", corner="empty", clean=True)
        yield dict(T=6, S=64, H=8, ranges="requests", corner="no_newest", clean=True)
        return
    for ranges in ("causal", "requests"):
        yield dict(T=4096, S=32768, H=V41_INDEX_HEADS, ranges=ranges, sparse_block=CANDIDATE_BLOCK,
                   num_blocks=CANDIDATE_BLOCKS)
    yield dict(T=2048, S=16384, H=V41_INDEX_HEADS, ranges="random", corner="empty", sparse_block=16,
               num_blocks=512, clean=True)
    yield dict(T=1000, S=7777, H=64, ranges="requests", sparse_block=CANDIDATE_BLOCK, num_blocks=256, clean=True,
               out=True)


def compare(params, ref_kwargs, ref_result, got_kwargs, got_result) -> Verdict:
    """§11's rule on the valid columns (each is a dense logit); clean=True: -inf exactly elsewhere."""
    c = Collector()
    indexer_logits_rule(c, ref_result, got_result, lambda: magnitude(ref_kwargs), ref_kwargs["clean"],
                        "columns of empty or invisible positions")
    return c.verdict()


def magnitude(kw: dict) -> torch.Tensor:
    """sum_h |w_h| sum_d |q_hd| |k_d| per column (the reference on the inputs' magnitudes)."""
    return OP.reference(
        fp8_abs(kw["q"]), fp8_abs(kw["k"]), kw["k_scale"].abs(), kw["weights"].abs(), kw["ks"], kw["ke"],
        kw["blocks"], kw["sparse_block"])


def unspecified(kw: dict):
    if kw["clean"]:
        return None
    pos = candidate_columns(kw["blocks"], kw["sparse_block"])
    n = (kw["ke"] - kw["ks"]).to(pos.device, torch.int64)
    return (pos < 0) | (pos >= n[:, None])


def cost(kw: dict) -> tuple[int, int]:
    """(bytes, flops): each row's candidate keys, q, weights, blocks, the logits written."""
    _, H, D = kw["q"].shape
    pos = candidate_columns(kw["blocks"], kw["sparse_block"])
    n = (kw["ke"] - kw["ks"]).to(pos.device, torch.int64)
    keys = int(((pos >= 0) & (pos < n[:, None])).sum())
    return keys * (D + 4) + nbytes(kw["q"], kw["weights"], kw["blocks"]) + pos.numel() * 4, 2 * H * D * keys


ERRORS = (
    ("q", change("q", lambda t: t.float())),
    ("k", change("k", lambda t: t[:, :64].contiguous())),
    ("k_scale", change("k_scale", lambda t: t[:-1])),
    ("k_scale", change("k_scale", lambda t: torch.zeros_like(t))),
    ("weights", change("weights", lambda t: t[:, :2])),
    ("ks", change("ks", lambda t: t.long())),
    ("ke", change("ke", lambda t: t + 1000)),
    ("blocks", change("blocks", lambda t: t.long())),
    ("blocks", change("blocks", lambda t: t.flip(1))),
    ("blocks", change("blocks", lambda t: torch.where(t >= 0, t + 1000, t))),
    ("blocks", change("blocks", lambda t: torch.cat([torch.full_like(t[:, :1], -1), t], 1))),   # -1 before a block
    ("sparse_block", set_args(sparse_block=0)),
    ("clean", set_args(clean="yes")),
    ("out", set_args(out=torch.empty(5, 7))),
)

SPEC = OpSpec(
    name="sparse_mqa_logits",
    section=16,
    doc="""q fp8 [T, H, 128]; k fp8 [S, 128] with k_scale fp32 [S]; weights fp32 [T, H]; ks, ke int32
    [T] (0 <= ks <= ke <= S); blocks int32 [T, num_blocks] (ascending blocks of row-local positions
    visible in [ks, ke), then -1). Returns fp32 [T, num_blocks * sparse_block]: column c is key
    ks + blocks[t, c // sparse_block] * sparse_block + c % sparse_block, its mqa_logits value;
    columns of -1 blocks or positions past ke unspecified (-inf with ``clean=True``).""",
    args=(
        Arg("q", Tensor, doc="float8_e4m3fn [T, H, 128] contiguous, H >= 1"),
        Arg("k", Tensor, doc="float8_e4m3fn [S, 128] contiguous, the keys"),
        Arg("k_scale", Tensor, doc="fp32 [S] contiguous, positive per-key scales (of the keys read)"),
        Arg("weights", Tensor, doc="fp32 [T, H], per-head weights"),
        Arg("ks", Tensor, doc="int32 [T], first key of each row's range"),
        Arg("ke", Tensor, doc="int32 [T], end of each row's key range (ks <= ke <= S)"),
        Arg("blocks", Tensor, doc="int32 [T, num_blocks], each row's candidate blocks (relative to ks), ascending, then -1"),
        Arg("sparse_block", int, doc="positions per candidate block (>= 1; V4.1: 8)"),
        Arg("clean", bool, False, keyword_only=True, doc="write exactly -inf in the columns with no visible key"),
        Arg("out", Optional[Tensor], None, keyword_only=True, mutated=True,
            doc="fp32 [T, num_blocks * sparse_block] contiguous, or None to allocate"),
    ),
    outputs="Tensor",
    check=check,
    fake=fake,
    reference="dsv4ops.reference.impl.sparse_mqa_logits:sparse_mqa_logits",
    composes=("mqa_logits",),            # its columns are mqa_logits values
    conformance=Conformance(
        inputs=inputs,
        cases=cases,
        typical=dict(T=64, S=512, num_blocks=16),
        compare=compare,
        strides={"weights": ("sliced", "transposed", "expanded"), "ks": ("sliced",),
                 "ke": ("sliced",), "blocks": ("sliced", "transposed")},
        stride_bases={"quick": (dict(T=9, S=72, H=8, ranges="random", clean=True, out=True),),
                      "full": (dict(T=1000, S=7777, H=64, ranges="requests", sparse_block=CANDIDATE_BLOCK,
                                    num_blocks=256, clean=True, out=True),)},
        error_base=dict(T=5, S=40, H=4, ranges="random"),
        errors=ERRORS,
        unspecified=unspecified,
    ),
    bench=BenchShapes(
        cost=cost,
        tiny=dict(T=4, S=64, num_blocks=4),
        production=(dict(T=4096, S=32768, ranges="causal", sparse_block=CANDIDATE_BLOCK, num_blocks=CANDIDATE_BLOCKS),),
        sweep=tuple(dict(T=T, S=S, ranges=r, sparse_block=CANDIDATE_BLOCK, num_blocks=CANDIDATE_BLOCKS)
                    for T, S in ((1024, 32768), (4096, 131072)) for r in ("causal", "requests")),
        matrix="fp8",
    ),
)
OP = define(SPEC)
