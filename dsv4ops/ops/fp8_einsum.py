"""Op 4 (docs/ops.md §4): block-scaled FP8 ``bhr,hdr->bhd`` (V4's grouped ``wo_a``), with V4's 128-wide
or V4.1's 32-wide scale blocks (the width read off ``b_scale``'s shape)."""
from __future__ import annotations

import itertools
import math
from typing import Optional

import torch
from torch import Tensor

from ..checker import Checker
from ..cost import nbytes
from ..opspec import Arg, BenchShapes, Conformance, OpSpec, define
from ..quant import SCALE_BLOCKS, scale_block
from ..sampling import change, quantize_blocks, randint, randn, set_args, to_device
from ..shapes import O_GROUP_K, O_GROUPS_PER_RANK, O_LORA_RANK
from ..tolerance import Collector, Verdict, calc_diff, close

EQUATION = "bhr,hdr->bhd"
MIN_BLOCK = min(SCALE_BLOCKS)
UE8M0_BLOCK = 32                        # scale blocks this narrow hold UE8M0 values (powers of two)
OUT_DTYPES = (torch.bfloat16, torch.float32)


def check(c: Checker, a):
    if a.equation != EQUATION:
        c.fail("equation", f"must be {EQUATION!r}, got {a.equation!r}")
    c.tensor("a", a.a, dtype=torch.float8_e4m3fn, shape=("B", "H", "R"), anchor=True, last_dim_contiguous=True)
    B, H, R = a.a.shape
    if R % MIN_BLOCK:
        c.fail("a", f"reduction dim R={R} must be a multiple of the scale block width (32 or 128)")
    c.tensor("b", a.b, dtype=torch.float8_e4m3fn, shape=(H, "D", R), contiguous=True)
    D = a.b.shape[1]
    if D % MIN_BLOCK:
        c.fail("b", f"output dim D={D} must be a multiple of the scale block width (32 or 128)")
    c.tensor("b_scale", a.b_scale, dtype=torch.float32, shape=(H, "D/w", "R/w"))
    block = scale_block(D, R, a.b_scale.shape[1:])
    if block is None:
        fits = " or ".join(_blocks_shape(H, D, R, w) for w in SCALE_BLOCKS)
        c.fail("b_scale", f"must be [H, D/w, R/w] for square blocks of width w = 128 or 32, {fits}, "
                          f"got {list(a.b_scale.shape)}")
    c.tensor("a_scale", a.a_scale, dtype=torch.float32, shape=(B, H, "R/w"))
    if a.a_scale.shape[2] != R // block:
        c.fail("a_scale", f"must be [B, H, R/{block}] = {[B, H, R // block]} (1 x {block} blocks, the width of "
                          f"b_scale's {block} x {block} blocks), got {list(a.a_scale.shape)}")
    for name in ("a_scale", "b_scale"):
        c.finite_positive(name, getattr(a, name))
        if block == UE8M0_BLOCK:
            _powers_of_two(c, name, getattr(a, name))
    if a.out_dtype not in OUT_DTYPES:
        c.fail("out_dtype", f"must be one of {[str(d) for d in OUT_DTYPES]}, got {a.out_dtype}")
    if a.out is not None:
        c.tensor("out", a.out, dtype=a.out_dtype, shape=(B, H, D), last_dim_contiguous=True)
    return a


def _blocks_shape(H: int, D: int, R: int, w: int) -> str:
    fits = D % w == 0 and R % w == 0
    return f"{[H, D // w, R // w]} for w = {w}" if fits else f"none for w = {w} (D and R are not multiples of {w})"


def _powers_of_two(c: Checker, name: str, t: Tensor) -> None:
    """32-wide block scales are UE8M0 values: every one a power of two (checked where values are)."""
    if t.numel() == 0 or not c.values_checked(t):
        return
    dense = t.contiguous()
    bad = (dense.view(torch.int32) & 0x7FFFFF) != 0               # a mantissa: not a power of two
    if bool(bad.any()):
        c.fail(name, f"32 x 32 block scales must be powers of two (UE8M0 values), found {dense[bad][0].item()}")


def fake(a):
    return a.a.new_empty(a.a.shape[0], a.a.shape[1], a.b.shape[1], dtype=a.out_dtype)


# ---------------------------------------------------------------------------------------------
# Conformance: sample inputs, cases, comparison rule, error inputs, bench shapes

def inputs(device, gen, *, B, H, D, R, block=128, group_major=False, out=False, out_dtype=torch.bfloat16):
    """Activations quantized per 1 x ``block``, weights per ``block`` x ``block`` (V4: 128, V4.1: 32), with
    magnitudes that change by powers of two from block to block, so neighbouring scales differ."""
    x = randn(gen, B, H, R) * (0.1 + torch.rand(B, H, 1, generator=gen)) * _gains(gen, (B, H, R // block), block, 1)
    w = randn(gen, H, D, R) * 0.05 * _gains(gen, (H, D // block, R // block), block, 2)
    if group_major:                            # vLLM's physical [G, T, K] transposed
        a8, sa = quantize_blocks(x.transpose(0, 1).contiguous(), 1, block)
        a8, sa = a8.transpose(0, 1), sa.transpose(0, 1)
    else:
        a8, sa = quantize_blocks(x, 1, block)
    b8, sb = quantize_blocks(w, block, block)
    kwargs = dict(equation="bhr,hdr->bhd", a=a8, a_scale=sa, b=b8, b_scale=sb, out_dtype=out_dtype)
    if out:
        kwargs["out"] = torch.empty(B, H, D, dtype=out_dtype)
    return to_device(kwargs, device)


def _gains(gen, blocks: tuple, block: int, dims: int) -> Tensor:
    """fp32 gains 2^-3 .. 2^3, one per block of ``blocks``, repeated over the last ``dims`` dimensions."""
    g = 2.0 ** randint(gen, -3, 4, blocks).float()
    for d in range(1, dims + 1):
        g = g.repeat_interleave(block, -d)
    return g


def cases(tier: str):
    if tier == "quick":
        yield dict(B=0, H=2, D=128, R=256)
        yield dict(B=3, H=2, D=128, R=0)                                   # empty sum: exact 0
        yield dict(B=5, H=2, D=128, R=512)
        yield dict(B=3, H=3, D=256, R=256, group_major=True, out=True)
        yield dict(B=4, H=1, D=128, R=384, out_dtype=torch.float32)
        # V4.1's 32-wide blocks: D and R not multiples of 128, odd K-step counts, empty sum and batch
        yield dict(B=0, H=2, D=32, R=64, block=32)
        yield dict(B=3, H=2, D=64, R=0, block=32)
        yield dict(B=5, H=2, D=96, R=160, block=32)
        yield dict(B=3, H=3, D=256, R=224, block=32, group_major=True, out=True)
        yield dict(B=4, H=1, D=160, R=96, block=32, out_dtype=torch.float32)
        return
    # V4.1 keeps V4's wo_a dimensions (o_lora_rank 1024, 8 heads x 512 per group) and group counts
    groups = sorted({g for gs in O_GROUPS_PER_RANK.values() for g in gs})
    for G, B, block in itertools.product(groups, (1, 7, 128), SCALE_BLOCKS):
        yield dict(B=B, H=G, D=O_LORA_RANK, R=O_GROUP_K, block=block, group_major=True)
    for block in SCALE_BLOCKS:
        yield dict(B=1024, H=8, D=O_LORA_RANK, R=O_GROUP_K, block=block)


def compare(params, ref_kwargs, ref_result, got_kwargs, got_result) -> Verdict:
    """calc_diff < 1e-6 and elementwise <= 1 ulp of the output dtype + 1e-5 sqrt(R) max|a| max|b|
    + 2^-12 sum_r |a sa| |b sb| (Hopper FP8 tensor cores accumulate each 128-deep block with about 13
    mantissa bits; that term is below a bf16 ulp but decides fp32 outputs). The same rule for 32-wide blocks."""
    c = Collector()
    if got_result.shape != ref_result.shape or got_result.dtype != ref_result.dtype:
        c.require(False, f"expected {ref_result.dtype} {list(ref_result.shape)}, "
                         f"got {got_result.dtype} {list(got_result.shape)}")
        return c.verdict()
    if ref_result.numel() == 0:
        return c.verdict()
    a, b = ref_kwargs["a"], ref_kwargs["b"]
    a_max = float((a.float().abs().amax(-1) * ref_kwargs["a_scale"].amax(-1)).max()) if a.numel() else 0.0
    b_max = float((b.float().abs().amax() * ref_kwargs["b_scale"].amax())) if b.numel() else 0.0   # R = 0: exact 0
    atol = 1e-5 * math.sqrt(a.shape[-1]) * a_max * b_max
    rtol = 2 ** -7 if ref_result.dtype == torch.bfloat16 else 1e-5      # 1 bf16 ulp
    atol = atol + 2 ** -12 * _abs_einsum(ref_kwargs)
    close(c, "d", got_result, ref_result, atol=atol, rtol=rtol)
    diff = calc_diff(got_result, ref_result)
    c.require(diff < 1e-6, f"calc_diff {diff:.3g} >= 1e-6")
    return c.verdict()


def _abs_einsum(kw) -> torch.Tensor:
    """sum_r |a[b,h,r] sa| |B[h,n,r] sb| as fp64 [B, H, D] (the magnitude the accumulation rounds)."""
    _, D, R = kw["b"].shape
    w = scale_block(D, R, kw["b_scale"].shape[1:])
    a = kw["a"].double().abs() * kw["a_scale"].double().repeat_interleave(w, -1)
    sb = kw["b_scale"].double().repeat_interleave(w, -1).repeat_interleave(w, -2)
    return torch.einsum("bhr,hdr->bhd", a, kw["b"].double().abs() * sb)


def cost(kw: dict) -> tuple[int, int]:
    """(bytes, flops) a kernel must move / do at least."""
    B, H, R = kw["a"].shape
    D = kw["b"].shape[1]
    out = B * H * D * (2 if kw["out_dtype"] == torch.bfloat16 else 4)
    return nbytes(kw["a"], kw["a_scale"], kw["b"], kw["b_scale"]) + out, 2 * B * H * D * R


ERRORS = (
    ("equation", set_args(equation="bhr,hrd->bhd")),
    ("a", change("a", lambda t: t.float())),
    ("a", change("a", lambda t: t[..., :100])),
    ("b", change("b", lambda t: t[:1])),
    ("b", change("b", lambda t: t.transpose(1, 2).contiguous().transpose(1, 2))),
    ("b", change("b", lambda t: t[:, :100].contiguous())),
    ("a_scale", change("a_scale", lambda t: t[..., :1])),
    ("a_scale", change("a_scale", lambda t: t.double())),
    ("b_scale", change("b_scale", lambda t: t.reshape(2, 2, 1))),
    ("b_scale", change("b_scale", lambda t: t.repeat_interleave(4, 1)[:, :, :2])),    # [H, D/32, R/128]
    ("a_scale", change("a_scale", lambda t: t.repeat_interleave(4, -1))),              # 1 x 32 with 128 x 128
    ("out_dtype", set_args(out_dtype=torch.float16)),
    ("out", set_args(out=torch.empty(2, 2, 128))),
)

SPEC = OpSpec(
    name="fp8_einsum",
    section=4,
    doc="""``d[b,h,n] = sum_r a[b,h,r] sa[b,h,r//w] * B[h,n,r] sb[h,n//w,r//w]`` in fp32, for scale blocks
    of width w = 128 (V4) or 32 (V4.1), read off b_scale's shape.

    a fp8 [B, H, R] (any batch strides), a_scale fp32 [B, H, R/w] (any strides: MN-major too); b fp8
    [H, D, R], b_scale fp32 [H, D/w, R/w] (any strides); scales finite and > 0, powers of two when
    w = 32. Returns [B, H, D] in ``out_dtype`` (bf16 or fp32).""",
    args=(
        Arg("equation", str, doc='"bhr,hdr->bhd" (the only one)'),
        Arg("a", Tensor, doc="float8_e4m3fn [B, H, R] (last dim contiguous)"),
        Arg("a_scale", Tensor, doc="fp32 [B, H, R/w], one scale per 1 x w block of a (any strides)"),
        Arg("b", Tensor, doc="float8_e4m3fn [H, D, R] contiguous"),
        Arg("b_scale", Tensor, doc="fp32 [H, D/w, R/w], one scale per w x w block of b, w = 128 or 32 "
                                   "(any strides)"),
        Arg("out", Optional[Tensor], None, keyword_only=True, mutated=True,
            doc="out_dtype [B, H, D] (last dim contiguous), or None to allocate"),
        Arg("out_dtype", torch.dtype, torch.bfloat16, keyword_only=True, doc="torch.bfloat16 or torch.float32"),
    ),
    outputs="Tensor",
    check=check,
    fake=fake,
    reference="dsv4ops.reference.impl.fp8_einsum:fp8_einsum",
    conformance=Conformance(
        inputs=inputs,
        cases=cases,
        typical=dict(B=4, H=8, D=O_LORA_RANK, R=O_GROUP_K),
        compare=compare,
        strides={"a": ("sliced",), "a_scale": ("transposed", "sliced", "expanded"),       # MN-major first
                   "b_scale": ("transposed", "sliced", "expanded"), "out": ("sliced",)},
        stride_bases={
            "quick": (dict(B=5, H=2, D=256, R=256, out=True), dict(B=5, H=2, D=96, R=128, block=32, out=True)),
            "full": (dict(B=64, H=8, D=1024, R=4096, out=True),),
        },
        error_base=dict(B=2, H=2, D=128, R=256),
        errors=ERRORS,
    ),
    bench=BenchShapes(
        cost=cost,
        tiny=dict(B=1, H=1, D=128, R=128),
        production=(dict(B=128, H=8, D=1024, R=4096), dict(B=1024, H=8, D=1024, R=4096),
                    dict(B=128, H=8, D=1024, R=4096, block=32), dict(B=1024, H=8, D=1024, R=4096, block=32)),
        sweep=tuple(dict(B=B, H=8, D=1024, R=4096) for B in (1, 32, 128, 512, 2048)),
        matrix="fp8",
    ),
    leading=("a", "a_scale", "out"),
)
OP = define(SPEC)
