"""Op 3 (docs/ops.md §3): lightning-indexer weighted-ReLU MQA logits over a paged FP8 or MXFP4 key cache."""
from __future__ import annotations

import itertools
import math
from typing import Optional

import torch
from torch import Tensor

from .. import formats
from ..checker import Checker
from ..index_checks import check_query
from ..cost import nbytes
from ..opspec import Arg, BenchShapes, Conformance, OpSpec, define
from ..rows import causal_row_lengths, decode_row_ends
from ..sampling import change, index_query, randint, randn, request_lengths, set_args, to_device
from ..shapes import C4_BLOCK, INDEX_HEADS, V41_INDEX_HEADS
from ..tolerance import Collector, Verdict, abs_index_cache, fp8_abs, indexer_logits_rule


KEY_BYTES = tuple(layout.token_bytes for layout in formats.INDEX_LAYOUTS.values())      # 132 (fp8), 68 (MXFP4)


def check(c: Checker, a):
    c.tensor("q", a.q, dtype=(torch.float8_e4m3fn, torch.uint8), shape=("B", "next_n", "H", None), anchor=True,
             contiguous=True)
    c.tensor("kv_cache", a.kv_cache, dtype=torch.uint8, shape=("num_blocks", "block_size", 1, None), contiguous=True)
    if a.kv_cache.shape[-1] not in KEY_BYTES:
        c.fail("kv_cache", f"must end in {' or '.join(map(str, KEY_BYTES))} bytes per token (index_fp8 or "
                           f"index_mxfp4 keys), got {list(a.kv_cache.shape)}")
    check_query(c, a.q, a.q_scale, ("B", "next_n"), a.kv_cache.shape[-1] == formats.INDEX_MXFP4_TOKEN_BYTES)
    if a.q.dtype != torch.uint8:
        c.tensor("q", a.q, shape=("B", "next_n", "H", formats.INDEX_DIM))
    B, next_n, H = a.q.shape[:3]
    if H < 1 or next_n < 1:
        c.fail("q", f"must have at least one head and one token per request, got H={H}, next_n={next_n}")
    if a.kv_cache.shape[1] < 1:
        c.fail("kv_cache", f"must have block_size (dim 1) >= 1, got {list(a.kv_cache.shape)}")
    c.tensor("weights", a.weights, dtype=torch.float32, shape=(B * next_n, H))
    lens = a.context_lens
    if not isinstance(lens, torch.Tensor) or lens.dim() not in (1, 2):
        c.fail("context_lens", f"must be int32 [B={B}] or [B={B}, next_n={next_n}]")
    c.tensor("context_lens", lens, dtype=torch.int32, shape=(B,) if lens.dim() == 1 else (B, next_n))
    c.tensor("block_table", a.block_table, dtype=torch.int32, shape=(B, "max_blocks"))
    c.int_arg("max_context_len", a.max_context_len, minimum=0)
    c.size_limit("max_context_len", a.max_context_len)
    c.bool_arg("clean", a.clean)
    c.out_buffer(a.out, dtype=torch.float32, shape=(B * next_n, a.max_context_len))
    block_size = a.kv_cache.shape[1]
    limit = min(a.max_context_len, a.block_table.shape[1] * block_size)
    c.in_range("context_lens", lens, 0, limit + 1,
               what=f"lengths (at most max_context_len and max_blocks * block_size = {limit})")
    if c.values_checked(a.block_table) and B:
        pages_needed = (lens.reshape(B, -1).amax(1).to(torch.int64) + block_size - 1) // block_size
        used = torch.arange(a.block_table.shape[1], device=a.block_table.device) < pages_needed[:, None]
        c.in_range("block_table", a.block_table[used], 0, a.kv_cache.shape[0], what="block ids of used pages")
    return a


def fake(a):
    return a.weights.new_empty(a.q.shape[0] * a.q.shape[1], a.max_context_len, dtype=torch.float32)


# ---------------------------------------------------------------------------------------------
# Conformance: sample inputs, cases, comparison rule, error inputs, bench shapes

def inputs(device, gen, *, B, next_n, context, H=64, block_size=64, lens_dim=2, scale_fmt="fp32",
           layout="index_fp8", q_fmt="fp8", clean=False, corner=None, out=False):
    """``layout``: the key cache (``index_fp8`` 132 B, ``index_mxfp4`` 68 B); ``q_fmt``: fp8 or mxfp4."""
    pages = max(1, math.ceil(context / block_size))
    num_blocks = B * pages + 3
    keys = randn(gen, num_blocks, block_size, 128) * (0.05 + torch.rand(num_blocks, block_size, 1, generator=gen))
    kv_cache = formats.pack_index_keys(keys, scale_fmt, layout)
    block_table = torch.randperm(num_blocks, generator=gen)[: B * pages].view(B, pages).to(torch.int32)
    lens = request_lengths(gen, B, context, {"zero_len": "every_other", "all_zero_len": "all"}.get(corner))
    if corner == "short":                       # lengths shorter than next_n
        lens = randint(gen, 0, next_n, (B,))
    if lens_dim == 2:
        lens = causal_row_lengths(lens, next_n)
    q, q_scale = index_query(randn(gen, B, next_n, H, 128) * 3, q_fmt)
    if corner == "padded_rows" and B > 1:       # vLLM pads MTP rows with zero Q, masked by lengths
        q.view(torch.uint8)[-1] = 0
    weights = randn(gen, B * next_n, H) * 0.2
    kwargs = dict(q=q, kv_cache=kv_cache, weights=weights, context_lens=lens.to(torch.int32),
                  block_table=block_table, max_context_len=pages * block_size, q_scale=q_scale, clean=clean)
    if out:
        kwargs["out"] = torch.empty(B * next_n, pages * block_size)
    return to_device(kwargs, device)


def cases(tier: str):
    if tier == "quick":
        yield dict(B=0, next_n=1, context=16, H=4, block_size=16)
        for next_n, lens_dim, clean in itertools.product((1, 2), (1, 2), (False, True)):
            yield dict(B=3, next_n=next_n, context=40, H=8, block_size=16, lens_dim=lens_dim,
                       clean=clean, scale_fmt="ue8m0" if clean else "fp32", out=next_n == 2)
        for corner in ("zero_len", "short", "padded_rows"):
            yield dict(B=3, next_n=2, context=24, H=8, block_size=16, corner=corner, clean=True)
        for lens_dim, clean in ((1, True), (2, False)):   # vLLM's MTP width; 64 heads: rows in 3 chunks + padding
            yield dict(B=2, next_n=6, context=40, H=64, block_size=16, lens_dim=lens_dim, clean=clean)
        for next_n in (3, 4, 5, 7, 8):                   # every width a speculative decoder uses
            yield dict(B=2, next_n=next_n, context=24, H=8, block_size=16, lens_dim=1 + next_n % 2, clean=True)
        yield dict(B=3, next_n=2, context=24, H=8, block_size=16, corner="all_zero_len", clean=True)
        for q_fmt, next_n in itertools.product(("fp8", "mxfp4"), (1, 4, 8)):      # V4.1: 68 B keys, 32 heads
            yield dict(B=3, next_n=next_n, context=40, H=V41_INDEX_HEADS, block_size=16, layout="index_mxfp4",
                       q_fmt=q_fmt, lens_dim=1 + next_n % 2, clean=next_n != 4, out=next_n == 4)
        for corner in ("zero_len", "short", "padded_rows", "all_zero_len"):
            yield dict(B=3, next_n=3, context=24, H=V41_INDEX_HEADS, block_size=16, layout="index_mxfp4",
                       q_fmt="mxfp4", corner=corner, clean=True)
        yield dict(B=2, next_n=2, context=24, H=5, block_size=8, layout="index_mxfp4", clean=True)
        return
    for B, next_n, context in itertools.product((4, 64), (1, 2), (2048, 8192)):
        yield dict(B=B, next_n=next_n, context=context, H=INDEX_HEADS, block_size=C4_BLOCK,
                   lens_dim=2, scale_fmt="ue8m0")
    yield dict(B=8, next_n=1, context=4096, H=INDEX_HEADS, block_size=C4_BLOCK, lens_dim=1, clean=True)
    yield dict(B=8, next_n=6, context=4096, H=INDEX_HEADS, block_size=C4_BLOCK, lens_dim=1,
               clean=True)                                        # vLLM's MTP test width
    for corner in ("zero_len", "short", "padded_rows", "all_zero_len"):
        yield dict(B=8, next_n=2, context=1024, H=INDEX_HEADS, block_size=C4_BLOCK, corner=corner,
                   clean=True)
    for next_n in range(3, 9):
        yield dict(B=16, next_n=next_n, context=8192, H=INDEX_HEADS, block_size=C4_BLOCK, lens_dim=1 + next_n % 2,
                   clean=True)
    v41 = dict(H=V41_INDEX_HEADS, block_size=C4_BLOCK, layout="index_mxfp4")          # DeepSeek-V4.1
    for (B, context), q_fmt in itertools.product(((4, 8192), (64, 2048), (128, 32768)), ("fp8", "mxfp4")):
        yield dict(B=B, next_n=1, context=context, q_fmt=q_fmt, lens_dim=2, **v41)
    for next_n in (2, 5, 8):                                       # DSpark verify widths
        yield dict(B=16, next_n=next_n, context=8192, q_fmt="mxfp4", lens_dim=1 + next_n % 2, clean=True, **v41)
    for corner in ("zero_len", "short", "padded_rows", "all_zero_len"):
        yield dict(B=8, next_n=2, context=1024, q_fmt="mxfp4", corner=corner, clean=True, **v41)


def compare(params, ref_kwargs, ref_result, got_kwargs, got_result) -> Verdict:
    """Valid region: calc_diff < 1e-6, and elementwise |d| <= 1e-4 * sum_h |w_h| sum_d |q_hd| |k_d|.

    The bound is on the magnitudes of the products, not of the logit: FP8 tensor cores accumulate
    each 128-term dot product with limited precision, an error proportional to sum_d |q_d k_d|
    (docs/ops.md §3). clean=True: -inf exactly past the length."""
    c = Collector()
    indexer_logits_rule(c, ref_result, got_result, lambda: magnitude(ref_kwargs), ref_kwargs["clean"],
                        "columns past the length")
    return c.verdict()


def magnitude(kw: dict) -> torch.Tensor:
    """fp32 [B * next_n, max_context_len]: sum_h |w_h| sum_d |q_hd| |k_d| (the reference on the inputs'
    magnitudes), the scale of the logits' error bound."""
    return OP.reference(
        fp8_abs(kw["q"]),
        abs_index_cache(kw["kv_cache"]), kw["weights"].abs(), kw["context_lens"], kw["block_table"],
        kw["max_context_len"], q_scale=kw.get("q_scale"))


def unspecified(kw: dict):
    """Without ``clean``, the columns past each row's length (None: every element is specified)."""
    if kw["clean"]:
        return None
    ends = decode_row_ends(kw["context_lens"], kw["q"].shape[1])
    return torch.arange(kw["max_context_len"], device=ends.device)[None, :] >= ends[:, None]


def cost(kw: dict) -> tuple[int, int]:
    """(bytes, flops) a kernel must move / do at least."""
    B, n, H = kw["q"].shape[:3]
    lens = kw["context_lens"].reshape(B, -1).amax(1).long()
    keys = int(lens.sum()) * kw["kv_cache"].shape[-1]
    moved = keys + nbytes(kw["q"], kw.get("q_scale"), kw["weights"]) + B * n * kw["max_context_len"] * 4
    return moved, 2 * n * H * formats.INDEX_DIM * int(lens.sum())


ERRORS = (
    ("q", change("q", lambda t: t.float())),
    ("q", change("q", lambda t: t[..., :64].contiguous())),
    ("kv_cache", change("kv_cache", lambda t: t[..., :128].contiguous())),
    ("weights", change("weights", lambda t: t[:1])),
    ("weights", change("weights", lambda t: t.bfloat16())),
    ("context_lens", change("context_lens", lambda t: t.long())),
    ("context_lens", change("context_lens", lambda t: t[:1])),
    ("context_lens", change("context_lens", lambda t: t + 1000)),
    ("context_lens", change("context_lens", lambda t: t - 1000)),
    ("block_table", change("block_table", lambda t: t.long())),
    ("block_table", change("block_table", lambda t: t + 1000)),
    ("max_context_len", set_args(max_context_len=-1)),
    ("clean", set_args(clean="yes")),
    ("out", set_args(out=torch.empty(3, 32))),
    ("kv_cache", change("kv_cache", lambda t: t[..., :67].contiguous())),
    ("q_scale", set_args(q_scale=torch.zeros(2, 2, 4, 4, dtype=torch.uint8))),       # with fp8 q
    ("q", change("q", lambda t: t.view(torch.uint8))),                             # MXFP4 q, 132 B keys
)

def on_mxfp4(edit):
    """An error input on MXFP4 keys and queries: the base call's keys and q re-quantized, then ``edit``."""
    def change(kw):
        kw["kv_cache"] = formats.pack_index_keys(formats.unpack_index_keys(kw["kv_cache"]), layout="index_mxfp4")
        kw["q"], kw["q_scale"] = index_query(kw["q"].float(), "mxfp4")
        edit(kw)
    return change


ERRORS += (
    ("q_scale", on_mxfp4(set_args(q_scale=None))),
    ("q_scale", on_mxfp4(change("q_scale", lambda t: t[..., :2].contiguous()))),
    ("q_scale", on_mxfp4(change("q_scale", lambda t: t.view(torch.int32)))),
    ("q", on_mxfp4(change("q", lambda t: t[..., :32].contiguous()))),
    ("q", on_mxfp4(change("q", lambda t: t.view(torch.int8)))),
)

SPEC = OpSpec(
    name="paged_mqa_logits",
    section=3,
    doc="""q fp8 [B, next_n, H, 128], or MXFP4 packed e2m1 uint8 [B, next_n, H, 64] with q_scale UE8M0
    uint8 [B, next_n, H, 4]; kv_cache uint8 [num_blocks, block_size, 1, 132] (fp8 keys) or [..., 68]
    (MXFP4 keys; MXFP4 q needs these); weights fp32 [B * next_n, H]; context_lens int32 [B] (causal
    MTP rule) or [B, next_n]; block_table int32 [B, max_blocks] (weights, context_lens and block_table:
    any strides). Returns fp32 [B * next_n, max_context_len]; columns past a row's length are
    unspecified, or exactly -inf with ``clean=True``.""",
    args=(
        Arg("q", Tensor, doc="float8_e4m3fn [B, next_n, H, 128], or MXFP4 packed e2m1 uint8 [B, next_n, H, 64]; "
                             "contiguous, H >= 1"),
        Arg("kv_cache", Tensor,
            doc="uint8 [num_blocks, block_size, 1, 132 or 68], the paged index keys (formats.pack_index_keys: "
                "index_fp8 or index_mxfp4)"),
        Arg("weights", Tensor, doc="fp32 [B * next_n, H], per-head weights"),
        Arg("context_lens", Tensor, doc="int32 [B] (causal MTP rule) or [B, next_n] per-row lengths"),
        Arg("block_table", Tensor, doc="int32 [B, max_blocks], key pages of each request"),
        Arg("max_context_len", int, doc="result columns (>= every length)"),
        Arg("q_scale", Optional[Tensor], None, keyword_only=True,
            doc="MXFP4 q only: UE8M0 bytes uint8 [B, next_n, H, 4] contiguous (byte j scales values 32j..32j+31)"),
        Arg("clean", bool, False, keyword_only=True, doc="write exactly -inf past each row's length"),
        Arg("out", Optional[Tensor], None, keyword_only=True, mutated=True,
            doc="fp32 [B * next_n, max_context_len] contiguous, or None to allocate"),
    ),
    outputs="Tensor",
    check=check,
    fake=fake,
    reference="dsv4ops.reference.impl.paged_mqa_logits:paged_mqa_logits",
    conformance=Conformance(
        inputs=inputs,
        cases=cases,
        typical=dict(B=2, next_n=1, context=256, H=INDEX_HEADS, block_size=C4_BLOCK),
        compare=compare,
        strides={"weights": ("sliced", "transposed", "expanded"),
                         "context_lens": ("sliced", "transposed", "expanded"),
                         "block_table": ("sliced", "transposed", "expanded")},
        stride_bases={
            "quick": (dict(B=3, next_n=3, context=40, H=4, block_size=16, lens_dim=2, clean=True, out=True),),
            "full": (dict(B=8, next_n=2, context=2048, H=64, block_size=64, lens_dim=2, clean=True, out=True),),
        },
        error_base=dict(B=2, next_n=2, context=32, H=4, block_size=16),
        errors=ERRORS,
        unspecified=unspecified,
    ),
    bench=BenchShapes(
        cost=cost,
        tiny=dict(B=1, next_n=1, context=64, H=64, block_size=64),
        production=(
            dict(B=128, next_n=1, context=8192, H=64, block_size=64),
            dict(B=64, next_n=2, context=8192, H=64, block_size=64),
            dict(B=32, next_n=6, context=8192, H=64, block_size=64),
            dict(B=128, next_n=1, context=8192, H=V41_INDEX_HEADS, block_size=64, layout="index_mxfp4", q_fmt="mxfp4"),
            dict(B=32, next_n=5, context=8192, H=V41_INDEX_HEADS, block_size=64, layout="index_mxfp4", q_fmt="fp8"),
        ),
        sweep=tuple(dict(B=B, next_n=1, context=ctx, H=64, block_size=64) for B in (8, 128)
                    for ctx in (2048, 8192, 32768, 131072))
        + tuple(dict(B=B, next_n=n, context=ctx, H=V41_INDEX_HEADS, block_size=64, layout="index_mxfp4", q_fmt=q_fmt)
                for B, n, ctx in ((128, 1, 8192), (32, 5, 8192), (8, 1, 131072)) for q_fmt in ("fp8", "mxfp4")),
        matrix="fp8",
    ),
)
OP = define(SPEC)
