"""The sparse attention family (docs/ops.md §2, §10): what sparse_mla_decode and sparse_mla_prefill
share, one contract for two ops (engines call a different kernel for prefill, and backends differ
per op): the arguments and their checks, the fake outputs, the sample inputs and the case families
built on them, the comparison rule."""
from __future__ import annotations

import functools
import itertools
import math
from collections.abc import Callable
from typing import Optional

import torch
from torch import Tensor

from . import formats
from .cache_checks import LAYOUT_DOC, check_kv_cache, check_layout
from .checker import Checker
from .formats import Layout
from .opspec import Arg, Op, Scale
from .quant import to_fp8
from .sampling import SOFTMAX_SCALE, filled_cache, index_lists, randn, to_device
from .shapes import C4_BLOCK, MAX_HEADS, SWA_BLOCK, WINDOW
from .tolerance import Collector, Verdict, calc_diff, close

ARGS = (
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
)
OUTPUTS = "(Tensor, Tensor?)"
# tensor argument -> the layouts the contract accepts besides contiguous (Conformance.strides)
STRIDES = {"indices": ("sliced", "transposed", "expanded"), "topk_lens": ("sliced",),
           "attn_sink": ("sliced", "expanded"), "extra_indices": ("sliced", "transposed"),
           "extra_topk_lens": ("sliced",)}


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
# Conformance: sample inputs, case families, comparison rule

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


def attention_rule(magnitude: Callable[[dict], torch.Tensor]):
    """The comparison rule of sparse_mla_decode and sparse_mla_prefill: FlashMLA's decode tolerances,
    out abs 1e-3 rel 2.01/128 plus 2^-8 of sum_k p_k |v_k| (``magnitude(ref_kwargs)``, fp32
    [T, H, 512]) (+ cosine), lse abs 1e-6 rel 8.01/65536."""
    return functools.partial(_compare_attention, magnitude)


def _compare_attention(magnitude, params, ref_kwargs, ref_result, got_kwargs, got_result) -> Verdict:
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
           slack=lambda: 2 ** -8 * magnitude(ref_kwargs)[:, :H])
    if ref_lse is not None:
        close(c, "lse", got_lse[:, :H], ref_lse[:, :H], atol=1e-6, rtol=8.01 / 65536)
    if ref_out.numel():
        cos = calc_diff(got_out.float(), ref_out.float())
        c.require(cos <= 5e-6 or not math.isfinite(cos), f"out: cosine difference {cos:.3g} > 5e-6")
    return c.verdict()


def output_magnitude(op: Op, kwargs: dict) -> torch.Tensor:
    """sum_k p_k |v_k| per output element of the call ``kwargs`` to ``op`` (sparse_mla_decode or
    sparse_mla_prefill): ``output_magnitude`` beside its reference, no dispatch."""
    return op.spec.reference_function("output_magnitude")(op.validate_call(**{**kwargs, "out": None}).args)
