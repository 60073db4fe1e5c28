"""Op 4 (docs/ops.md §4): block-scaled FP8 ``bhr,hdr->bhd`` (V4's grouped ``wo_a``)."""
from __future__ import annotations

import itertools
import math
from typing import Optional

import torch
from torch import Tensor

from ..checker import Checker
from ..cost import nbytes
from ..opspec import Arg, BenchShapes, Conformance, OpSpec, define
from ..sampling import change, quantize_blocks, randn, set_args, to_device
from ..shapes import O_GROUP_K, O_GROUPS_PER_RANK, O_LORA_RANK
from ..tolerance import Collector, Verdict, calc_diff, close

EQUATION = "bhr,hdr->bhd"
BLOCK = 128
OUT_DTYPES = (torch.bfloat16, torch.float32)


def check(c: Checker, a):
    if a.equation != EQUATION:
        c.fail("equation", f"must be {EQUATION!r}, got {a.equation!r}")
    c.tensor("a", a.a, dtype=torch.float8_e4m3fn, shape=("B", "H", "R"), anchor=True, last_dim_contiguous=True)
    B, H, R = a.a.shape
    if R % BLOCK:
        c.fail("a", f"reduction dim R={R} must be a multiple of {BLOCK}")
    c.tensor("b", a.b, dtype=torch.float8_e4m3fn, shape=(H, "D", R), contiguous=True)
    D = a.b.shape[1]
    if D % BLOCK:
        c.fail("b", f"output dim D={D} must be a multiple of {BLOCK}")
    c.tensor("a_scale", a.a_scale, dtype=torch.float32, shape=(B, H, R // BLOCK))
    c.tensor("b_scale", a.b_scale, dtype=torch.float32, shape=(H, D // BLOCK, R // BLOCK))
    c.finite_positive("a_scale", a.a_scale)
    c.finite_positive("b_scale", a.b_scale)
    if a.out_dtype not in OUT_DTYPES:
        c.fail("out_dtype", f"must be one of {[str(d) for d in OUT_DTYPES]}, got {a.out_dtype}")
    if a.out is not None:
        c.tensor("out", a.out, dtype=a.out_dtype, shape=(B, H, D), last_dim_contiguous=True)
    return a


def fake(a):
    return a.a.new_empty(a.a.shape[0], a.a.shape[1], a.b.shape[1], dtype=a.out_dtype)


# ---------------------------------------------------------------------------------------------
# Conformance: sample inputs, cases, comparison rule, error inputs, bench shapes

def inputs(device, gen, *, B, H, D, R, group_major=False, out=False, out_dtype=torch.bfloat16):
    x = randn(gen, B, H, R) * (0.1 + torch.rand(B, H, 1, generator=gen))
    w = randn(gen, H, D, R) * 0.05
    if group_major:                            # vLLM's physical [G, T, K] transposed
        a8, sa = quantize_blocks(x.transpose(0, 1).contiguous(), 1)
        a8, sa = a8.transpose(0, 1), sa.transpose(0, 1)
    else:
        a8, sa = quantize_blocks(x, 1)
    b8, sb = quantize_blocks(w, 128)
    kwargs = dict(equation="bhr,hdr->bhd", a=a8, a_scale=sa, b=b8, b_scale=sb, out_dtype=out_dtype)
    if out:
        kwargs["out"] = torch.empty(B, H, D, dtype=out_dtype)
    return to_device(kwargs, device)


def cases(tier: str):
    if tier == "quick":
        yield dict(B=0, H=2, D=128, R=256)
        yield dict(B=3, H=2, D=128, R=0)                                   # empty sum: exact 0
        yield dict(B=5, H=2, D=128, R=512)
        yield dict(B=3, H=3, D=256, R=256, group_major=True, out=True)
        yield dict(B=4, H=1, D=128, R=384, out_dtype=torch.float32)
        return
    groups = sorted({g for gs in O_GROUPS_PER_RANK.values() for g in gs})
    for G, B in itertools.product(groups, (1, 7, 128)):
        yield dict(B=B, H=G, D=O_LORA_RANK, R=O_GROUP_K, group_major=True)
    yield dict(B=1024, H=8, D=O_LORA_RANK, R=O_GROUP_K)


def compare(params, ref_kwargs, ref_result, got_kwargs, got_result) -> Verdict:
    """calc_diff < 1e-6 and elementwise <= 1 ulp of the output dtype + 1e-5 sqrt(R) max|a| max|b|
    + 2^-12 sum_r |a sa| |b sb| (Hopper FP8 tensor cores accumulate each 128-deep block with about 13
    mantissa bits; that term is below a bf16 ulp but decides fp32 outputs)."""
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
    a = kw["a"].double().abs() * kw["a_scale"].double().repeat_interleave(128, -1)
    sb = kw["b_scale"].double().repeat_interleave(128, -1).repeat_interleave(128, -2)
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
    ("out_dtype", set_args(out_dtype=torch.float16)),
    ("out", set_args(out=torch.empty(2, 2, 128))),
)

SPEC = OpSpec(
    name="fp8_einsum",
    section=4,
    doc="""``d[b,h,n] = sum_r a[b,h,r] sa[b,h,r//128] * B[h,n,r] sb[h,n//128,r//128]`` in fp32.

    a fp8 [B, H, R] (any batch strides), a_scale fp32 [B, H, R/128] (any strides: MN-major too); b fp8
    [H, D, R], b_scale fp32 [H, D/128, R/128] (any strides); scales finite and > 0. Returns [B, H, D]
    in ``out_dtype`` (bf16 or fp32).""",
    args=(
        Arg("equation", str, doc='"bhr,hdr->bhd" (the only one)'),
        Arg("a", Tensor, doc="float8_e4m3fn [B, H, R] (last dim contiguous)"),
        Arg("a_scale", Tensor, doc="fp32 [B, H, R/128], one scale per 1x128 block of a (any strides)"),
        Arg("b", Tensor, doc="float8_e4m3fn [H, D, R] contiguous"),
        Arg("b_scale", Tensor, doc="fp32 [H, D/128, R/128], one scale per 128x128 block of b (any strides)"),
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
            "quick": (dict(B=5, H=2, D=256, R=256, out=True),),
            "full": (dict(B=64, H=8, D=1024, R=4096, out=True),),
        },
        error_base=dict(B=2, H=2, D=128, R=256),
        errors=ERRORS,
    ),
    bench=BenchShapes(
        cost=cost,
        tiny=dict(B=1, H=1, D=128, R=128),
        production=(dict(B=128, H=8, D=1024, R=4096), dict(B=1024, H=8, D=1024, R=4096)),
        sweep=tuple(dict(B=B, H=8, D=1024, R=4096) for B in (1, 32, 128, 512, 2048)),
        matrix="fp8",
    ),
)
OP = define(SPEC)
