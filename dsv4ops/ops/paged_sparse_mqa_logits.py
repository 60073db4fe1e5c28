"""Op 15 (docs/ops.md §15): the two-level indexer's consumer logits, decode form: paged_mqa_logits
restricted to each row's candidate blocks, laid out block after block."""
from __future__ import annotations

import itertools
import math
from typing import Optional

import torch
from torch import Tensor

from .. import formats
from ..checker import Checker
from ..index_checks import check_blocks
from ..cost import nbytes
from ..opspec import Arg, BenchShapes, Conformance, OpSpec, define
from ..quant import to_fp8
from ..rows import candidate_columns, causal_row_lengths, decode_row_ends
from ..sampling import change, randint, randn, random_blocks, request_lengths, set_args, to_device
from ..shapes import CANDIDATE_BLOCK, CANDIDATE_BLOCKS, V41_INDEX_HEADS
from ..tolerance import Collector, Verdict, abs_index_cache, fp8_abs, indexer_logits_rule


def check(c: Checker, a):
    c.tensor("q", a.q, dtype=torch.float8_e4m3fn, shape=("B", "next_n", "H", formats.INDEX_DIM), anchor=True,
             contiguous=True)
    B, next_n, H = a.q.shape[:3]
    if H < 1 or next_n < 1:
        c.fail("q", f"must have at least one head and one token per request, got H={H}, next_n={next_n}")
    cache = a.kv_cache
    if not isinstance(cache, torch.Tensor) or cache.dim() != 4 or cache.shape[-1] not in (
            formats.INDEX_TOKEN_BYTES, formats.INDEX_MXFP4_TOKEN_BYTES):
        c.fail("kv_cache", "must be uint8 [num_blocks, block_size, 1, 132] (index_fp8) or [..., 68] (index_mxfp4)")
    c.tensor("kv_cache", cache, dtype=torch.uint8, shape=("num_blocks", "block_size", 1, cache.shape[-1]),
             contiguous=True)
    if cache.shape[1] < 1:
        c.fail("kv_cache", f"must have block_size (dim 1) >= 1, got {list(cache.shape)}")
    c.tensor("weights", a.weights, dtype=torch.float32, shape=(B * next_n, H))
    lens = a.context_lens
    if not isinstance(lens, torch.Tensor) or lens.dim() not in (1, 2):
        c.fail("context_lens", f"must be int32 [B={B}] or [B={B}, next_n={next_n}]")
    c.tensor("context_lens", lens, dtype=torch.int32, shape=(B,) if lens.dim() == 1 else (B, next_n))
    c.tensor("block_table", a.block_table, dtype=torch.int32, shape=(B, "max_blocks"))
    limit = a.block_table.shape[1] * cache.shape[1]
    c.in_range("context_lens", lens, 0, limit + 1, what=f"lengths (at most max_blocks * block_size = {limit})")
    c.bool_arg("clean", a.clean)
    width = check_blocks(c, a, B * next_n, decode_row_ends(lens, next_n) if c.values_checked(lens) else None)
    c.out_buffer(a.out, dtype=torch.float32, shape=(B * next_n, width))
    if c.values_checked(a.block_table) and B:
        pages_needed = (lens.reshape(B, -1).amax(1).to(torch.int64) + cache.shape[1] - 1) // cache.shape[1]
        used = torch.arange(a.block_table.shape[1], device=a.block_table.device) < pages_needed[:, None]
        c.in_range("block_table", a.block_table[used], 0, cache.shape[0], what="block ids of used pages")
    return a


def fake(a):
    return a.q.new_empty(a.q.shape[0] * a.q.shape[1], a.blocks.shape[1] * a.sparse_block, dtype=torch.float32)


# ---------------------------------------------------------------------------------------------
# Conformance: sample inputs, cases, comparison rule, error inputs, bench shapes

def inputs(device, gen, *, B, next_n, context, H=V41_INDEX_HEADS, block_size=64, layout="index_fp8",
           sparse_block=8, num_blocks=8, lens_dim=1, scale_fmt="fp32", clean=False, corner=None, out=False):
    """Keys of positions no row's candidate block covers have NaN scales (a kernel that reads them
    outside the candidates writes NaN into valid columns)."""
    pages = max(1, math.ceil(context / block_size))
    cache_blocks = B * pages + 3
    keys = randn(gen, cache_blocks, block_size, 128) * (0.05 + torch.rand(cache_blocks, block_size, 1, generator=gen))
    kv_cache = formats.pack_index_keys(keys, scale_fmt, layout=layout)
    block_table = torch.randperm(cache_blocks, generator=gen)[: B * pages].view(B, pages).to(torch.int32)
    lens = request_lengths(gen, B, context, "every_other" if corner == "zero_len" else None)
    if corner == "short":
        lens = randint(gen, 0, next_n, (B,))
    if lens_dim == 2:
        lens = causal_row_lengths(lens, next_n)
    row_lens = decode_row_ends(lens, next_n)
    blocks = random_blocks(gen, row_lens, num_blocks, sparse_block, newest=corner != "no_newest")
    pos = candidate_columns(blocks, sparse_block).reshape(B, next_n * num_blocks * sparse_block)
    covered = torch.zeros(B, pages * block_size + 1, dtype=torch.bool)
    covered.scatter_(1, torch.where(pos >= 0, pos, pages * block_size), True)
    slot_pages = block_table.long()[:, :, None].expand(B, pages, block_size).reshape(B, pages * block_size)
    stale_pages, stale_slots = slot_pages[~covered[:, :-1]], torch.arange(pages * block_size).expand(B, -1)[
        ~covered[:, :-1]] % block_size
    data_bytes = 128 if layout == "index_fp8" else 64
    scale_bytes = kv_cache.view(cache_blocks, -1)[:, block_size * data_bytes:].view(cache_blocks, block_size, 4)
    nan = [0x00, 0x00, 0xC0, 0x7F] if layout == "index_fp8" else [255, 255, 255, 255]     # fp32 / UE8M0 NaN
    scale_bytes[stale_pages, stale_slots] = torch.tensor(nan, dtype=torch.uint8)
    q = to_fp8(randn(gen, B, next_n, H, 128) * 3)
    kwargs = dict(q=q, kv_cache=kv_cache, weights=randn(gen, B * next_n, H) * 0.2, context_lens=lens.to(torch.int32),
                  block_table=block_table, blocks=blocks, sparse_block=sparse_block, clean=clean)
    if out:
        kwargs["out"] = torch.empty(B * next_n, num_blocks * sparse_block)
    return to_device(kwargs, device)


def cases(tier: str):
    if tier == "quick":
        yield dict(B=0, next_n=1, context=16, H=4, block_size=16)
        for layout, next_n, clean in itertools.product(("index_fp8", "index_mxfp4"), (1, 2), (False, True)):
            yield dict(B=3, next_n=next_n, context=72, H=8, block_size=16, layout=layout, num_blocks=4,
                       lens_dim=1 + next_n % 2, clean=clean, scale_fmt="ue8m0" if clean else "fp32", out=next_n == 2)
        yield dict(B=2, next_n=1, context=40, H=V41_INDEX_HEADS, block_size=16, num_blocks=8, clean=True)  # all fit
        yield dict(B=3, next_n=2, context=64, H=8, block_size=16, sparse_block=16, num_blocks=2, clean=True)
        yield dict(B=3, next_n=1, context=50, H=5, block_size=8, sparse_block=3, num_blocks=6, clean=True)
        for corner in ("zero_len", "short", "no_newest"):
            yield dict(B=3, next_n=2, context=48, H=8, block_size=16, num_blocks=3, corner=corner, clean=True)
        for next_n in (4, 8):
            yield dict(B=2, next_n=next_n, context=48, H=8, block_size=16, num_blocks=3, clean=True)
        return
    for layout, B in itertools.product(("index_fp8", "index_mxfp4"), (4, 64)):
        yield dict(B=B, next_n=1, context=32768, H=V41_INDEX_HEADS, block_size=64, layout=layout,
                   sparse_block=CANDIDATE_BLOCK, num_blocks=CANDIDATE_BLOCKS, scale_fmt="ue8m0")
    yield dict(B=16, next_n=2, context=8192, H=V41_INDEX_HEADS, block_size=64, sparse_block=CANDIDATE_BLOCK,
               num_blocks=CANDIDATE_BLOCKS, lens_dim=2, clean=True)
    for next_n in (4, 8):
        yield dict(B=8, next_n=next_n, context=32768, H=V41_INDEX_HEADS, block_size=128, layout="index_mxfp4",
                   sparse_block=16, num_blocks=1024, clean=True)
    yield dict(B=8, next_n=2, context=4096, H=64, block_size=64, sparse_block=CANDIDATE_BLOCK,
               num_blocks=CANDIDATE_BLOCKS, corner="zero_len", clean=True)


def compare(params, ref_kwargs, ref_result, got_kwargs, got_result) -> Verdict:
    """§3's rule on the valid columns (each is a dense logit); clean=True: -inf exactly elsewhere."""
    c = Collector()
    indexer_logits_rule(c, ref_result, got_result, lambda: magnitude(ref_kwargs), ref_kwargs["clean"],
                        "columns of empty or invisible positions")
    return c.verdict()


def magnitude(kw: dict) -> torch.Tensor:
    """sum_h |w_h| sum_d |q_hd| |k_d| per column (the reference on the inputs' magnitudes)."""
    return OP.reference(
        fp8_abs(kw["q"]), abs_index_cache(kw["kv_cache"]), kw["weights"].abs(), kw["context_lens"],
        kw["block_table"], kw["blocks"], kw["sparse_block"])


def unspecified(kw: dict):
    if kw["clean"]:
        return None
    pos = candidate_columns(kw["blocks"], kw["sparse_block"])
    n = decode_row_ends(kw["context_lens"], kw["q"].shape[1]).to(pos.device)
    return (pos < 0) | (pos >= n[:, None])


def cost(kw: dict) -> tuple[int, int]:
    """(bytes, flops): the candidate keys once per row, q, weights, blocks, the logits written."""
    _, n, H, D = kw["q"].shape
    pos = candidate_columns(kw["blocks"], kw["sparse_block"])
    lens = decode_row_ends(kw["context_lens"], n).to(pos.device)
    keys = int(((pos >= 0) & (pos < lens[:, None])).sum())
    return (keys * kw["kv_cache"].shape[-1] + nbytes(kw["q"], kw["weights"], kw["blocks"]) + pos.numel() * 4,
            2 * H * D * keys)


ERRORS = (
    ("q", change("q", lambda t: t.float())),
    ("kv_cache", change("kv_cache", lambda t: t[..., :128].contiguous())),
    ("weights", change("weights", lambda t: t[:1])),
    ("context_lens", change("context_lens", lambda t: t.long())),
    ("context_lens", change("context_lens", lambda t: t + 1000)),
    ("block_table", change("block_table", lambda t: t + 1000)),
    ("blocks", change("blocks", lambda t: t.long())),
    ("blocks", change("blocks", lambda t: t[:1])),
    ("blocks", change("blocks", lambda t: t.flip(1))),                                  # descending / -1 first
    ("blocks", change("blocks", lambda t: torch.where(t >= 0, t + 1000, t))),           # past the length
    ("blocks", change("blocks", lambda t: torch.cat([torch.full_like(t[:, :1], -1), t], 1))),   # -1 before a block
    ("sparse_block", set_args(sparse_block=0)),
    ("clean", set_args(clean="yes")),
    ("out", set_args(out=torch.empty(3, 32))),
)

SPEC = OpSpec(
    name="paged_sparse_mqa_logits",
    section=15,
    doc="""q fp8 [B, next_n, H, 128]; kv_cache uint8 [num_pages, block_size, 1, 132 or 68] (index_fp8 or
    index_mxfp4 keys); weights fp32 [B * next_n, H]; context_lens int32 [B] (causal MTP rule) or
    [B, next_n]; block_table int32 [B, max_blocks]; blocks int32 [B * next_n, num_blocks] (ascending
    visible blocks, then -1; candidate_blocks' output). Returns fp32 [B * next_n, num_blocks *
    sparse_block]: column c is position blocks[r, c // sparse_block] * sparse_block + c % sparse_block,
    its paged_mqa_logits value; columns of -1 blocks or invisible positions unspecified (-inf with
    ``clean=True``).""",
    args=(
        Arg("q", Tensor, doc="float8_e4m3fn [B, next_n, H, 128] contiguous, H >= 1"),
        Arg("kv_cache", Tensor, doc="uint8 [num_pages, block_size, 1, 132 | 68], the paged index keys"),
        Arg("weights", Tensor, doc="fp32 [B * next_n, H], per-head weights"),
        Arg("context_lens", Tensor, doc="int32 [B] (causal MTP rule) or [B, next_n] per-row lengths"),
        Arg("block_table", Tensor, doc="int32 [B, max_blocks], key pages of each request"),
        Arg("blocks", Tensor, doc="int32 [B * next_n, num_blocks], each row's candidate blocks, ascending, then -1"),
        Arg("sparse_block", int, doc="positions per candidate block (>= 1; V4.1: 8)"),
        Arg("clean", bool, False, keyword_only=True, doc="write exactly -inf in the columns with no visible position"),
        Arg("out", Optional[Tensor], None, keyword_only=True, mutated=True,
            doc="fp32 [B * next_n, num_blocks * sparse_block] contiguous, or None to allocate"),
    ),
    outputs="Tensor",
    check=check,
    fake=fake,
    reference="dsv4ops.reference.impl.paged_sparse_mqa_logits:paged_sparse_mqa_logits",
    composes=("paged_mqa_logits",),      # its columns are paged_mqa_logits values
    conformance=Conformance(
        inputs=inputs,
        cases=cases,
        typical=dict(B=2, next_n=1, context=512, block_size=64, num_blocks=16),
        compare=compare,
        strides={"weights": ("sliced", "transposed", "expanded"), "context_lens": ("sliced", "transposed", "expanded"),
                 "block_table": ("sliced", "transposed", "expanded"), "blocks": ("sliced", "transposed")},
        stride_bases={
            "quick": (dict(B=3, next_n=2, context=48, H=4, block_size=16, num_blocks=3, clean=True, out=True),),
            "full": (dict(B=8, next_n=2, context=8192, block_size=64, num_blocks=CANDIDATE_BLOCKS, clean=True,
                          out=True),),
        },
        error_base=dict(B=3, next_n=1, context=40, H=4, block_size=16, num_blocks=3),
        errors=ERRORS,
        unspecified=unspecified,
    ),
    bench=BenchShapes(
        cost=cost,
        tiny=dict(B=1, next_n=1, context=64, block_size=64, num_blocks=4),
        production=(
            dict(B=128, next_n=1, context=32768, block_size=64, sparse_block=CANDIDATE_BLOCK,
                 num_blocks=CANDIDATE_BLOCKS),
            dict(B=128, next_n=1, context=32768, block_size=64, layout="index_mxfp4", sparse_block=CANDIDATE_BLOCK,
                 num_blocks=CANDIDATE_BLOCKS),
        ),
        sweep=tuple(dict(B=B, next_n=1, context=ctx, block_size=64, sparse_block=CANDIDATE_BLOCK,
                         num_blocks=CANDIDATE_BLOCKS) for B in (8, 128) for ctx in (16384, 65536, 131072)),
        matrix="fp8",
    ),
)
OP = define(SPEC)
