"""Op 1 (docs/ops.md §1): Q RMSNorm + RoPE, KV RoPE + quantize + paged insert at ``slot_mapping``."""
from __future__ import annotations

import itertools
from typing import Optional

import torch
from torch import Tensor

from .. import formats, quant
from ..cache_checks import LAYOUT_DOC, check_kv_cache, check_layout
from ..checker import TOKENS_WRITTEN, Checker
from ..cost import nbytes
from ..formats import Layout
from ..opspec import Arg, BenchShapes, Conformance, OpSpec, Scale, define
from ..sampling import change, cos_sin_cache, randint, randn, random_cache_bytes, set_args, to_device
from ..shapes import ATTENTION_LAYOUTS, HEADS_PER_RANK, MAX_HEADS, SWA_BLOCK
from ..tolerance import (BF16_ROUNDING, Collector, Verdict, bf16_ulp_close, block_amax, close, fp8_blocks_close,
                         fp8_ulp_close)


def check(c: Checker, a):
    c.tensor("q", a.q, dtype=torch.bfloat16, shape=("T", "H", formats.HEAD_DIM), anchor=True, contiguous=True)
    T, H = a.q.shape[0], a.q.shape[1]
    if not 1 <= H <= MAX_HEADS:
        c.fail("q", f"must have 1 to {MAX_HEADS} heads, got H={H}")
    c.tensor("kv", a.kv, dtype=torch.bfloat16, shape=(T, formats.HEAD_DIM), last_dim_contiguous=True)
    c.tensor("positions", a.positions, dtype=torch.int64, shape=(T,))
    c.tensor("cos_sin_cache", a.cos_sin_cache, dtype=torch.float32, shape=("max_pos", formats.ROPE_DIM),
             contiguous=True)
    layout = check_layout(c, a.layout)
    c.int_arg("block_size", a.block_size, minimum=1)
    check_kv_cache(c, "kv_cache", a.kv_cache, layout, a.block_size)
    c.tensor("slot_mapping", a.slot_mapping, dtype=torch.int64, shape=(TOKENS_WRITTEN,))
    if a.slot_mapping.shape[0] > T:
        c.fail("slot_mapping", f"must have at most T={T} entries, got {a.slot_mapping.shape[0]}")
    c.float_arg("eps", a.eps, positive=True)
    c.float_arg("kv_scale", a.kv_scale, positive=True, tensor_ok=True)
    c.float_arg("q_scale", a.q_scale, positive=True, tensor_ok=True)
    c.out_buffer(a.out, dtype=layout.query_dtype, shape=(T, H, formats.HEAD_DIM))
    c.in_range("positions", a.positions, 0, a.cos_sin_cache.shape[0], what="positions (rows of cos_sin_cache)")
    c.in_range("slot_mapping", a.slot_mapping, None, a.kv_cache.shape[0] * a.block_size,
               what="slots (negative = skip)")
    return a._replace(layout=layout)


def fake(a):
    """What the call returns: ``out`` if given, else ``q`` itself, else (fp8_per_tensor) a new fp8 query."""
    if a.out is not None:
        return a.out
    layout = Layout.of(a.layout)
    return a.q if layout.query_dtype == a.q.dtype else a.q.new_empty(a.q.shape, dtype=layout.query_dtype)


# ---------------------------------------------------------------------------------------------
# Conformance: sample inputs, cases, comparison rule, error inputs, bench shapes

def inputs(device, gen, *, T, H, layout, block_size=64, num_blocks=4, skip_slots=0.25,
                         dp_pad=0, max_pos=4096, out=False, page_bytes=None, eps=1e-6, extremes=False):
    """``extremes``: the 32-value blocks of kv scaled by 0, 1e-6 (below the MXFP8 amax floor), 1e-3,
    1 and 1e4 in turn (zero, subnormal and large scales)."""
    q = (randn(gen, T, H, 512) * (0.5 + 4 * torch.rand(T, H, 1, generator=gen))).to(torch.bfloat16)
    kv = randn(gen, T, 512) * (0.01 + 3 * torch.rand(T, 1, generator=gen))
    if extremes:
        kv = kv * torch.tensor([0.0, 1e-6, 1e-3, 1.0, 1e4]).repeat(4)[:16].repeat_interleave(32)
    kv = kv.to(torch.bfloat16)
    positions = randint(gen, 0, max_pos, (T,))
    if T >= 2:                                  # both ends of the cos/sin cache
        positions[0], positions[-1] = 0, max_pos - 1
    n_kv = max(T - dp_pad, 0)
    num_slots = num_blocks * block_size
    slots = torch.randperm(num_slots, generator=gen)[:n_kv]
    if len(slots) < n_kv:
        raise ValueError("not enough cache slots for the tokens")
    slots = torch.where(torch.rand(n_kv, generator=gen) < skip_slots, torch.full_like(slots, -1), slots)
    scales = dict(kv_scale=0.5, q_scale=0.25) if Layout.of(layout).has_tensor_scale else {}
    out_dtype = Layout.of(layout).query_dtype
    kwargs = dict(q=q, kv=kv, positions=positions, cos_sin_cache=cos_sin_cache(max_pos),
                  kv_cache=random_cache_bytes(gen, num_blocks, block_size, layout, page_bytes),
                  slot_mapping=slots, layout=layout, block_size=block_size, eps=eps, **scales)
    if out:
        kwargs["out"] = torch.empty(T, H, 512, dtype=out_dtype)
    return to_device(kwargs, device)


def cases(tier: str):
    if tier == "quick":
        yield dict(T=0, H=4, layout="fp8_ds_mla")
        for layout, H, bs in itertools.product(ATTENTION_LAYOUTS, (3, 16), (64, 16)):
            yield dict(T=5, H=H, layout=layout, block_size=bs, num_blocks=3,
                       dp_pad=1 if H == 3 else 0, out=bs == 16)
        yield from v41_cases(T=5, H=3, block_size=16, num_blocks=3)
        return
    heads = sorted({h for hs in HEADS_PER_RANK.values() for h in hs})
    for layout, H, T in itertools.product(ATTENTION_LAYOUTS, heads, (1, 64)):
        yield dict(T=T, H=H, layout=layout, block_size=SWA_BLOCK, num_blocks=8)
    yield dict(T=300, H=64, layout="fp8_ds_mla", block_size=SWA_BLOCK,
               num_blocks=16, dp_pad=7, out=True)
    yield from v41_cases(T=64, H=64, block_size=SWA_BLOCK, num_blocks=8)


def v41_cases(**shape):
    """mxfp8_v41 split and inline, default (padded) and exact (unpadded) page widths, the V4.1
    RMSNorm eps (1e-20)."""
    for layout, exact in itertools.product(("mxfp8_v41", "mxfp8_v41_inline"), (False, True)):
        page = Layout.of(layout).min_page_bytes(shape["block_size"]) + (0 if exact else 40)
        yield dict(shape, layout=layout, page_bytes=page, eps=1e-20, dp_pad=int(exact))
    yield dict(shape, layout="mxfp8_v41", eps=1e-20, extremes=True)


def compare(params, ref_kwargs, ref_result, got_kwargs, got_result) -> Verdict:
    c = Collector()
    layout, bs = Layout.of(ref_kwargs["layout"]), ref_kwargs["block_size"]
    if layout.has_tensor_scale:
        fp8_ulp_close(c, "q_fp8", got_result, ref_result)
        c.require(torch.equal(got_kwargs["q"].view(torch.int16), ref_kwargs["q"].view(torch.int16)),
                  "q: the bf16 input must be left unmodified in the fp8_per_tensor layout")
    else:
        close(c, "q'", got_result, ref_result, atol=1e-6, rtol=2 ** -7)
    got_cache, ref_cache = got_kwargs["kv_cache"], ref_kwargs["kv_cache"]
    if layout.is_ds_mla:
        g_data, _ = formats.ds_mla_views(got_cache, bs)
        r_data, _ = formats.ds_mla_views(ref_cache, bs)
        bf16_ulp_close(c, "cache RoPE bytes", g_data[..., formats.NOPE_DIM:], r_data[..., formats.NOPE_DIM:])
        rope_mask = torch.zeros_like(got_cache, dtype=torch.bool)
        rope_bytes = rope_mask[:, : bs * formats.DS_MLA_DATA_BYTES].view(-1, bs, formats.DS_MLA_DATA_BYTES)
        rope_bytes[..., formats.NOPE_DIM:] = True
        mismatch = (got_cache != ref_cache) & ~rope_mask
        c.require(not bool(mismatch.any()), f"cache: {int(mismatch.sum())} bytes differ outside the RoPE values "
                  f"(fp8 values, scale bytes, pad byte or bytes no slot owns), first at "
                  f"{torch.nonzero(mismatch)[0].tolist() if mismatch.any() else None}")
    elif layout.kind == Layout.MXFP8:
        slots = ref_kwargs["slot_mapping"]
        rows = OP.spec.reference_function("cache_rows")(OP.validate_call(**ref_kwargs).args)[: slots.shape[0]]
        _compare_mxfp8_cache(c, got_cache, ref_cache, layout, bs, slots[slots >= 0], rows[slots >= 0])
    elif layout.kind == Layout.BF16:
        close(c, "cache", got_cache, ref_cache, atol=1e-6, rtol=2 ** -7)
        nope_same = torch.equal(got_cache[..., : formats.NOPE_DIM].view(torch.int16),
                                ref_cache[..., : formats.NOPE_DIM].view(torch.int16))
        c.require(nope_same, "cache: NoPE bf16 values must be copied exactly")
    else:
        fp8_ulp_close(c, "cache", got_cache, ref_cache)
        nope_same = torch.equal(got_cache[..., : formats.NOPE_DIM].view(torch.uint8),
                                ref_cache[..., : formats.NOPE_DIM].view(torch.uint8))
        c.require(nope_same, "cache: NoPE fp8 bytes must be exact")
    return c.verdict()


def _compare_mxfp8_cache(c: Collector, got: torch.Tensor, ref: torch.Tensor, layout: Layout, bs: int,
                         slots: torch.Tensor, rows: torch.Tensor) -> None:
    """At the written ``slots`` (the reference's unquantized ``rows`` [N, 512] fp32 there): NoPE blocks
    (values and scale bytes) byte for byte, the two RoPE blocks within one e4m3 step (the rotated
    bf16 values may differ by an ulp, and so a scale where a block's amax is at the boundary); every
    other byte exact."""
    nope_blocks = formats.NOPE_DIM // layout.scale_block
    block, off = slots // bs, slots % bs
    (gd, gs), (rd, rs) = formats.record_views(got, layout, bs), formats.record_views(ref, layout, bs)
    fp8 = lambda d: d[block, off, formats.NOPE_DIM:].view(torch.float8_e4m3fn)
    scale = lambda s: quant.ue8m0_to_float(s[block, off, nope_blocks:])
    amax = block_amax(rows[:, formats.NOPE_DIM:], layout.scale_block)
    fp8_blocks_close(c, "cache RoPE blocks", (fp8(gd), scale(gs)), (fp8(rd), scale(rs)), layout.scale_block, amax,
                     BF16_ROUNDING)
    rope = torch.zeros_like(got, dtype=torch.bool)
    rd_mask, rs_mask = formats.record_views(rope, layout, bs)
    rd_mask[block, off, formats.NOPE_DIM:] = True
    rs_mask[block, off, nope_blocks:] = True
    mismatch = (got != ref) & ~rope
    c.require(not bool(mismatch.any()), f"cache: {int(mismatch.sum())} bytes differ outside the RoPE blocks "
              f"(NoPE values and scales, bytes no slot owns), first at "
              f"{torch.nonzero(mismatch)[0].tolist() if mismatch.any() else None}")


def cost(kw: dict) -> tuple[int, int]:
    """(bytes, flops) a kernel must move / do at least."""
    T, H, D = kw["q"].shape
    written = int((kw["slot_mapping"] >= 0).sum())
    row_bytes = Layout.of(kw["layout"]).token_bytes
    return 2 * nbytes(kw["q"]) + nbytes(kw["kv"], kw["positions"]) + written * (row_bytes + 64 * 4), 0


ERRORS = (
    ("q", change("q", lambda t: t.float())),
    ("q", change("q", lambda t: t[..., :256].contiguous())),
    ("q", change("q", lambda t: torch.zeros(4, 129, 512, dtype=torch.bfloat16))),
    ("q", change("q", lambda t: t.transpose(0, 1).contiguous().transpose(0, 1))),
    ("kv", change("kv", lambda t: t[:3])),
    ("positions", change("positions", lambda t: t.int())),
    ("positions", change("positions", lambda t: t + 10_000)),
    ("cos_sin_cache", change("cos_sin_cache", lambda t: t[:, :32].contiguous())),
    ("layout", set_args(layout="fp8")),
    ("kv_cache", change("kv_cache", lambda t: t[:, :-1].contiguous())),
    ("kv_cache", set_args(layout="bf16")),
    ("kv_cache", set_args(layout="mxfp8_v41", kv_cache=torch.zeros(2, 16 * 528 - 1, dtype=torch.uint8))),
    ("layout", set_args(layout="nvfp4_v41")),
    ("slot_mapping", change("slot_mapping", lambda t: torch.cat([t, t]))),
    ("slot_mapping", change("slot_mapping", lambda t: t.clamp_min(0) + 32)),
    ("block_size", set_args(block_size=0)),
    ("eps", set_args(eps=-1.0)),
    ("out", set_args(out=torch.empty(4, 4, 256, dtype=torch.bfloat16))),
)

SPEC = OpSpec(
    name="qnorm_rope_kv_insert",
    section=1,
    doc="""Normalize + rope Q, rope + quantize KV into ``kv_cache`` at ``slot_mapping`` (-1 = skip).

    q bf16 [T, H, 512], kv bf16 [T, 512] (any row stride), positions int64 [T], cos_sin_cache fp32
    [max_pos, 64], slot_mapping int64 [T'] (T' <= T; positions and slot_mapping: any stride).
    Returns bf16 [T, H, 512] (``q`` itself unless ``out``) for
    "fp8_ds_mla"/"bf16", float8_e4m3fn [T, H, 512] for "fp8_per_tensor" (``q`` unmodified).""",
    args=(
        Arg("q", Tensor, mutated=True, same_view_ok=("out",),
            doc="bf16 [T, H, 512], rewritten in place unless out= or fp8_per_tensor"),
        Arg("kv", Tensor, doc="bf16 [T, 512]"),
        Arg("positions", Tensor, doc="int64 [T]"),
        Arg("cos_sin_cache", Tensor, doc="fp32 [max_pos, 64]"),
        Arg("kv_cache", Tensor, mutated=True, doc="the SWA cache in `layout` (formats.allocate_kv_cache)"),
        Arg("slot_mapping", Tensor, doc="int64 [T'], negative = skip"),
        Arg("layout", Layout, keyword_only=True, doc=LAYOUT_DOC),
        Arg("block_size", int, keyword_only=True, doc="tokens per page of kv_cache"),
        Arg("eps", float, 1e-6, keyword_only=True, doc="RMSNorm epsilon (> 0)"),
        Arg("kv_scale", Scale, 1.0, keyword_only=True,
            doc='"fp8_per_tensor": the cache scale (float or 1-element fp32 tensor)'),
        Arg("q_scale", Scale, 1.0, keyword_only=True,
            doc='"fp8_per_tensor": the query scale (float or 1-element fp32 tensor)'),
        Arg("out", Optional[Tensor], None, keyword_only=True, mutated=True, same_view_ok=("q",),
            doc="the query result buffer (layout's query dtype [T, H, 512]), or None"),
    ),
    outputs="Tensor",
    check=check,
    fake=fake,
    out_variant_only=True,
    reference="dsv4ops.reference.impl.qnorm_rope_kv_insert:qnorm_rope_kv_insert",
    conformance=Conformance(
        inputs=inputs,
        cases=cases,
        typical=dict(T=4, H=64, layout="fp8_ds_mla", block_size=SWA_BLOCK),
        compare=compare,
        strides={"kv": ("sliced", "expanded"), "positions": ("expanded", "sliced"),
                             "slot_mapping": ("sliced",)},
        stride_bases={
            "quick": (dict(T=5, H=3, layout="fp8_ds_mla", block_size=16, num_blocks=3, out=True),),
            "full": (dict(T=64, H=64, layout="fp8_ds_mla", block_size=64, num_blocks=8, out=True),),
        },
        error_base=dict(T=4, H=4, layout="fp8_ds_mla", block_size=16, num_blocks=2),
        errors=ERRORS,
    ),
    bench=BenchShapes(
        cost=cost,
        tiny=dict(T=1, H=8, layout="fp8_ds_mla", block_size=64, num_blocks=1),
        production=(
            dict(T=128, H=64, layout="fp8_ds_mla", block_size=64, num_blocks=8),
            dict(T=128, H=128, layout="fp8_ds_mla", block_size=64, num_blocks=8),
        ),
    ),
)
OP = define(SPEC)
