"""Op 2 (docs/ops.md §2): sparse MQA decode over the SWA cache plus an optional extra cache."""
from __future__ import annotations

import functools
import importlib
import itertools
import math
from typing import Optional

import torch
from torch import Tensor

from .. import formats, registry
from ..cache_checks import LAYOUT_DOC, check_kv_cache, check_layout
from ..checker import Checker
from ..cost import nbytes, selected_entries
from ..formats import Layout
from ..opspec import Arg, BenchShapes, Conformance, OpSpec, Scale, define
from ..quant import to_fp8
from ..sampling import SOFTMAX_SCALE, change, filled_cache, index_lists, randn, set_args, to_device
from ..shapes import (ATTENTION_LAYOUTS, C4_BLOCK, C128_BLOCK, HEADS_PER_RANK, INDEX_TOPK, MAX_HEADS, SWA_BLOCK,
                      WINDOW)
from ..tolerance import Collector, Verdict, calc_diff, close


def check(c: Checker, a):
    layout = check_layout(c, a.layout)
    c.tensor("q", a.q, dtype=layout.query_dtype, shape=("T", "H", formats.HEAD_DIM), anchor=True, contiguous=True)
    T, H = a.q.shape[0], a.q.shape[1]
    if not 1 <= H <= MAX_HEADS:
        c.fail("q", f"must have 1 to {MAX_HEADS} heads, got H={H}")
    c.int_arg("block_size", a.block_size, minimum=1)
    extra_layout = check_extra_layout(c, layout, a.extra_layout)
    check_kv_cache(c, "kv_cache", a.kv_cache, layout, a.block_size)
    _check_index_list(c, "indices", "topk_lens", a.indices, a.topk_lens, T, a.kv_cache.shape[0] * a.block_size)
    c.float_arg("softmax_scale", a.softmax_scale, positive=True)
    c.optional("attn_sink", a.attn_sink, dtype=torch.float32, shape=(H,))
    c.not_nan("attn_sink", a.attn_sink)
    if a.extra_kv_cache is None:
        if any(x is not None for x in (a.extra_indices, a.extra_topk_lens, a.extra_block_size)):
            c.fail("extra_kv_cache", "is required when extra_indices / extra_topk_lens / extra_block_size are given")
    else:
        if a.extra_indices is None:
            c.fail("extra_indices", "is required with extra_kv_cache")
        c.int_arg("extra_block_size", a.extra_block_size, minimum=1)
        check_kv_cache(c, "extra_kv_cache", a.extra_kv_cache, extra_layout, a.extra_block_size)
        _check_index_list(c, "extra_indices", "extra_topk_lens", a.extra_indices, a.extra_topk_lens, T,
                          a.extra_kv_cache.shape[0] * a.extra_block_size)
    c.float_arg("kv_scale", a.kv_scale, positive=True, tensor_ok=True)
    c.float_arg("q_scale", a.q_scale, positive=True, tensor_ok=True)
    c.out_buffer(a.out, dtype=torch.bfloat16, shape=(T, H, formats.HEAD_DIM))
    c.bool_arg("need_lse", a.need_lse)
    c.disjoint(a, "kv_cache", others=("q",))
    c.disjoint(a, "extra_kv_cache", others=("q",))
    return a._replace(layout=layout, extra_layout=extra_layout)


def check_extra_layout(c: Checker, layout: Layout, extra_layout) -> Layout:
    """The extra cache's layout: ``layout`` when None; a V4 layout allows only itself, an
    ``mxfp8_v41*`` one any ``mxfp8_v41*`` or ``nvfp4_v41*`` (docs/ops.md §6)."""
    if extra_layout is None:
        return layout
    extra = check_layout(c, extra_layout, "extra_layout")
    if layout.is_v41 and not extra.is_v41 or not layout.is_v41 and extra is not layout:
        allowed = [n for n, x in formats.LAYOUTS.items() if x.is_v41] if layout.is_v41 else [layout.name]
        c.fail("extra_layout", f"must be None or one of {allowed} with layout={layout}, got {extra}")
    return extra


def _check_index_list(c: Checker, name: str, lens_name: str, indices, lens, T: int, num_slots: int) -> None:
    c.tensor(name, indices, dtype=torch.int32, shape=(T, "topk"))
    c.optional(lens_name, lens, dtype=torch.int32, shape=(T,))
    c.in_range(name, indices, 0, num_slots, allow=-1, what="cache indices (-1 = invalid)")
    c.in_range(lens_name, lens, 0, indices.shape[1] + 1, what="lengths (at most topk)")


def fake(a):
    T, H, D = a.q.shape
    out = a.q.new_empty(T, H, D, dtype=torch.bfloat16)
    return out, a.q.new_empty(T, H, dtype=torch.float32) if a.need_lse else None


# ---------------------------------------------------------------------------------------------
# Conformance: sample inputs, cases, comparison rule, error inputs, bench shapes

def inputs(device, gen, *, T, H, topk, layout, block_size=64, extra_topk=0, extra_block_size=64,
                      sink="random", lens="random", corner=None, out=False, need_lse=True, extra_slots=0,
                      extra_layout=None, exact_pages=False):
    """Inputs of sparse_mla_decode and sparse_mla_prefill; ``extra_slots`` sizes the extra cache (at
    least twice extra_topk) to spread the selections, as a long context does; ``exact_pages``: V4.1
    pages of exactly ``block_size * token_bytes`` (no padding)."""
    page = lambda lay, bs: Layout.of(lay).min_page_bytes(bs) if exact_pages else None
    per_tensor = Layout.of(layout).has_tensor_scale
    kv_scale = 0.25 if per_tensor else 1.0
    num_slots = max(2 * topk, 4 * block_size)
    num_slots += (-num_slots) % block_size
    idx, lens_t, selected = index_lists(gen, T, topk, num_slots, lens, corner)
    qf = randn(gen, T, H, 512)
    kwargs = dict(q=to_fp8(qf * 2) if per_tensor else qf.to(torch.bfloat16),
                  kv_cache=filled_cache(gen, layout, block_size, num_slots, selected, kv_scale,
                                        page(layout, block_size)),
                  indices=idx, topk_lens=lens_t, layout=layout, block_size=block_size,
                  softmax_scale=SOFTMAX_SCALE)
    if per_tensor:
        kwargs.update(kv_scale=kv_scale, q_scale=0.5)
    if extra_topk:
        n_extra = max(2 * extra_topk, 4 * extra_block_size, extra_slots)
        n_extra += (-n_extra) % extra_block_size
        e_idx, e_lens, e_sel = index_lists(gen, T, extra_topk, n_extra, lens, corner)
        e_layout = extra_layout or layout
        kwargs.update(extra_kv_cache=filled_cache(gen, e_layout, extra_block_size, n_extra, e_sel, kv_scale,
                                                  page(e_layout, extra_block_size)),
                      extra_indices=e_idx, extra_topk_lens=e_lens, extra_block_size=extra_block_size)
        if extra_layout is not None:
            kwargs["extra_layout"] = extra_layout
    if sink == "random":
        kwargs["attn_sink"] = randn(gen, H) * 2
    elif sink == "inf":
        kwargs["attn_sink"] = torch.where(torch.arange(H) % 2 == 0, float("inf"), float("-inf"))
    if out:
        kwargs["out"] = torch.empty(T, H, 512, dtype=torch.bfloat16)
    if not need_lse:
        kwargs["need_lse"] = False
    return to_device(kwargs, device)


def grid_cases(tier: str, T: int):
    """The head x extra top-k x extra page size grid (decode and prefill): every head count a rank
    has, extra lists from one tile to past FlashMLA's largest, page sizes from 2 (C128) to 256."""
    if tier == "quick":
        grid = itertools.product((8, 128), ((64, 2), (128, 256)))
    else:
        grid = itertools.product((8, 32, 64, 128), itertools.product((128, 640, 1152), (2, 64, 256)))
    for H, (extra_topk, extra_block_size) in grid:
        yield dict(T=T, H=H, topk=WINDOW if tier == "full" else 32, layout="fp8_ds_mla",
                   block_size=SWA_BLOCK if tier == "full" else 16, extra_topk=extra_topk,
                   extra_block_size=extra_block_size)


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


def v41_cases(tier: str, T: int, H: int):
    """V4.1 caches (decode and prefill): every main x extra layout pair (split, inline, mixed), padded
    and exact pages, the corner cases; sinks None / +-inf."""
    topk, bs, extra = (WINDOW, SWA_BLOCK, 512) if tier == "full" else (32, 16, 64)
    base = dict(T=T, H=H, topk=topk, block_size=bs, extra_topk=extra, extra_block_size=C4_BLOCK if tier == "full" else 16)
    mains, extras = ("mxfp8_v41", "mxfp8_v41_inline"), ("nvfp4_v41", "nvfp4_v41_inline", "mxfp8_v41", None)
    for i, (main, extra_layout) in enumerate(itertools.product(mains, extras)):
        yield dict(base, layout=main, extra_layout=extra_layout, exact_pages=i % 2 == 1)
    for i, corner in enumerate(("all_invalid", "pad_middle", "duplicates", "zero_len")):
        yield dict(base, layout="mxfp8_v41", extra_layout="nvfp4_v41_inline", corner=corner, exact_pages=i % 2 == 0)
    yield dict(base, layout="mxfp8_v41_inline", extra_layout="nvfp4_v41", sink="inf", lens="full", out=True)
    yield dict(base, layout="mxfp8_v41", extra_layout="nvfp4_v41", sink=None, lens=None, need_lse=False)


def attention_rule(op: str):
    """The comparison rule of sparse_mla_decode and sparse_mla_prefill (``op``): FlashMLA's decode
    tolerances, out abs 1e-3 rel 2.01/128 plus 2^-8 of sum_k p_k |v_k| (+ cosine), lse abs 1e-6 rel
    8.01/65536."""
    return functools.partial(_compare_attention, op)


def _compare_attention(op, params, ref_kwargs, ref_result, got_kwargs, got_result) -> Verdict:
    c = Collector()
    (ref_out, ref_lse), (got_out, got_lse) = ref_result, got_result
    H = ref_kwargs["q"].shape[1]
    c.require(tuple(got_out.shape) == tuple(ref_out.shape) and got_out.dtype == torch.bfloat16,
              f"out: expected bf16 {list(ref_out.shape)}, got {got_out.dtype} {list(got_out.shape)}")
    if ref_lse is None:
        c.require(got_lse is None, "lse: need_lse=False but a tensor came back")
    else:
        c.require(got_lse is not None and tuple(got_lse.shape) == tuple(ref_lse.shape),
                  f"lse: expected {list(ref_lse.shape)}, got {None if got_lse is None else list(got_lse.shape)}")
    if c.failures:
        return c.verdict()
    close(c, "out", got_out[:, :H], ref_out[:, :H], atol=1e-3, rtol=2.01 / 128,
           slack=lambda: 2 ** -8 * _attention_magnitude(op, ref_kwargs)[:, :H])
    if ref_lse is not None:
        close(c, "lse", got_lse[:, :H], ref_lse[:, :H], atol=1e-6, rtol=8.01 / 65536)
    if ref_out.numel():
        cos = calc_diff(got_out.float(), ref_out.float())
        c.require(cos <= 5e-6 or not math.isfinite(cos), f"out: cosine difference {cos:.3g} > 5e-6")
    return c.verdict()


def _attention_magnitude(op: str, kwargs: dict) -> torch.Tensor:
    """sum_k p_k |v_k| per output element (``output_magnitude`` beside ``op``'s reference)."""
    module = importlib.import_module(registry.get_op(op).spec.reference.partition(":")[0])
    return module.output_magnitude(registry.get_op(op).validate_call(**{**kwargs, "out": None}).args)


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
    args=(
        Arg("q", Tensor, doc="bf16 [T, H, 512] (fp8 for fp8_per_tensor)"),
        Arg("kv_cache", Tensor, doc="the SWA cache in `layout`"),
        Arg("indices", Tensor, doc="int32 [T, topk] cache slots, -1 invalid"),
        Arg("topk_lens", Optional[Tensor], None, doc="int32 [T] valid prefix of each index row"),
        Arg("layout", Layout, keyword_only=True, doc=LAYOUT_DOC),
        Arg("block_size", int, keyword_only=True, doc="tokens per page of kv_cache"),
        Arg("softmax_scale", float, keyword_only=True, doc="scale of q.k (> 0)"),
        Arg("attn_sink", Optional[Tensor], None, keyword_only=True, doc="fp32 [H]"),
        Arg("extra_kv_cache", Optional[Tensor], None, keyword_only=True, doc="the compressed cache"),
        Arg("extra_indices", Optional[Tensor], None, keyword_only=True,
            doc="int32 [T, extra_topk] slots of extra_kv_cache, -1 invalid"),
        Arg("extra_topk_lens", Optional[Tensor], None, keyword_only=True,
            doc="int32 [T] valid prefix of each extra index row, or None"),
        Arg("extra_block_size", Optional[int], None, keyword_only=True, doc="tokens per page of extra_kv_cache"),
        Arg("extra_layout", Optional[Layout], None, keyword_only=True, none_means="layout",
            doc='layout of extra_kv_cache (None: `layout`); with "mxfp8_v41*" any "mxfp8_v41*" or "nvfp4_v41*"'),
        Arg("kv_scale", Scale, 1.0, keyword_only=True,
            doc='"fp8_per_tensor": the cache scale (float or 1-element fp32 tensor)'),
        Arg("q_scale", Scale, 1.0, keyword_only=True,
            doc='"fp8_per_tensor": the query scale (float or 1-element fp32 tensor)'),
        Arg("out", Optional[Tensor], None, keyword_only=True, mutated=True, doc="bf16 [T, H, 512]"),
        Arg("need_lse", bool, True, keyword_only=True,
            doc="False: the lse result is None (admits kernels without it)"),
    ),
    outputs="(Tensor, Tensor?)",
    check=check,
    fake=fake,
    reference="dsv4ops.reference.impl.sparse_mla_decode:sparse_mla_decode",
    conformance=Conformance(
        inputs=inputs,
        cases=cases,
        typical=dict(T=4, H=64, topk=WINDOW, layout="fp8_ds_mla", block_size=SWA_BLOCK, extra_topk=512,
                     extra_block_size=C4_BLOCK),
        compare=attention_rule("sparse_mla_decode"),
        strides={"indices": ("sliced", "transposed", "expanded"), "topk_lens": ("sliced",),
                 "attn_sink": ("sliced", "expanded"), "extra_indices": ("sliced", "transposed"),
                 "extra_topk_lens": ("sliced",)},
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
