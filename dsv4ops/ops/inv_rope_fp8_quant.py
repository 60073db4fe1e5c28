"""Op (docs/ops.md §8): inverse RoPE of the attention output + 1 x ``block`` FP8 quantization (V4: 128,
V4.1: 32), per o-projection group, producing ``fp8_einsum``'s ``a`` / ``a_scale``."""
from __future__ import annotations

import itertools

import torch
from torch import Tensor

from .. import formats
from ..checker import Checker
from ..cost import nbytes
from ..opspec import Arg, BenchShapes, Conformance, OpSpec, define
from ..quant import SCALE_BLOCKS
from ..sampling import change, cos_sin_cache, randint, randn, set_args, to_device
from ..shapes import HEADS_PER_RANK, O_GROUPS_PER_RANK
from ..tolerance import FP32_ROUNDING, Collector, Verdict, fp8_blocks_close


def check(c: Checker, a):
    c.tensor("o", a.o, dtype=torch.bfloat16, shape=("T", "H", formats.HEAD_DIM), anchor=True,
             last_dim_contiguous=True)
    T, H = a.o.shape[0], a.o.shape[1]
    c.tensor("positions", a.positions, dtype=torch.int64, shape=(T,))
    c.tensor("cos_sin_cache", a.cos_sin_cache, dtype=torch.float32, shape=("max_pos", formats.ROPE_DIM),
             contiguous=True)
    c.int_arg("n_groups", a.n_groups, minimum=1)
    c.int_arg("block", a.block, choices=SCALE_BLOCKS)
    if H == 0 or H % a.n_groups:
        c.fail("o", f"must have a positive number of heads divisible by n_groups={a.n_groups}, got H={H}")
    c.in_range("positions", a.positions, 0, a.cos_sin_cache.shape[0], what="positions (rows of cos_sin_cache)")
    return a


def fake(a):
    T, H, D = a.o.shape
    K = H // a.n_groups * D
    return (a.o.new_empty(T, a.n_groups, K, dtype=torch.float8_e4m3fn),
            a.o.new_empty(T, a.n_groups, K // a.block, dtype=torch.float32))


# ---------------------------------------------------------------------------------------------
# Conformance: sample inputs, cases, comparison rule, error inputs, bench shapes

def inputs(device, gen, *, T, H, n_groups, block=128, max_pos=4096, head_stride=0, corner=None):
    """Attention outputs of V4 magnitude (|o| up to about 0.5, one scale per head); ``head_stride``
    > H makes ``o`` a head slice of a wider buffer. ``corner``: ``"zero_head"`` zeroes head 0 (amax
    floor); ``"tiny"`` scales head 0 by 1e-5 (amax below 1e-4) and its second block by a further 1e-7
    (amax below the 1e-10 floor); ``"saturate"`` puts ±7·2^m (m = 0..2, amax / 448 a power of two: the
    block's largest value lands on 448) and -6.9375·2^m (rounds up to 448) into every head's first
    block, and 7.0625·2^m (just past the power of two) into its second."""
    width = max(head_stride, H)
    o = randn(gen, T, width, 512) * (0.01 + 0.2 * torch.rand(T, width, 1, generator=gen))
    if corner == "zero_head" and T:
        o[:, 0] = 0.0
    if corner == "tiny" and T:
        o[:, 0] *= 1e-5
        o[:, 0, block:2 * block] *= 1e-7
    if corner == "saturate" and T:
        m = 2.0 ** randint(gen, 0, 3, (T, width)).float()
        sign = torch.where(torch.rand(T, width, generator=gen) < 0.5, -1.0, 1.0)
        o[:, :, 0], o[:, :, 1], o[:, :, block] = 7 * m * sign, -6.9375 * m * sign, 7.0625 * m
    positions = randint(gen, 0, max_pos, (T,))
    if T >= 2:
        positions[0], positions[-1] = 0, max_pos - 1
    kwargs = dict(o=o.to(torch.bfloat16)[:, :H], positions=positions, cos_sin_cache=cos_sin_cache(max_pos),
                  n_groups=n_groups, block=block)
    return to_device(kwargs, device)


def cases(tier: str):
    if tier == "quick":
        yield dict(T=0, H=8, n_groups=1)
        yield dict(T=5, H=16, n_groups=2)
        yield dict(T=3, H=6, n_groups=3, head_stride=8, corner="zero_head")
        yield dict(T=4, H=8, n_groups=8)
        yield dict(T=3, H=4, n_groups=2, corner="saturate")
        # V4.1's 1 x 32 blocks
        yield dict(T=0, H=8, n_groups=1, block=32)
        yield dict(T=5, H=16, n_groups=2, block=32)
        yield dict(T=3, H=6, n_groups=3, head_stride=8, corner="zero_head", block=32)
        yield dict(T=4, H=8, n_groups=4, corner="saturate", block=32)
        yield dict(T=3, H=4, n_groups=1, corner="tiny", block=32)
        return
    # V4.1 keeps V4's heads and o-groups per rank (8 heads per group); only the block width changes
    for model, heads in HEADS_PER_RANK.items():
        for H, G in zip(heads, O_GROUPS_PER_RANK[model]):
            for T, block in itertools.product((1, 128), SCALE_BLOCKS):
                yield dict(T=T, H=H, n_groups=G, block=block)
    for block in SCALE_BLOCKS:
        yield dict(T=2048, H=64, n_groups=8, block=block, corner="zero_head")
        yield dict(T=64, H=64, n_groups=8, block=block, head_stride=72)
    yield dict(T=256, H=64, n_groups=8, block=32, corner="saturate")
    yield dict(T=256, H=64, n_groups=8, block=32, corner="tiny")


def compare(params, ref_kwargs, ref_result, got_kwargs, got_result) -> Verdict:
    """Both results per 1 x block block (the width read off the reference's shapes): scales equal, or
    one power of two off where the block's amax is at the boundary (the rotation is fp32 arithmetic),
    values within one e4m3 step."""
    c = Collector()
    values, scales = ref_result
    block = values.shape[-1] // scales.shape[-1] if scales.shape[-1] else SCALE_BLOCKS[0]
    amax = OP.spec.reference_function("unquantized_blocks")(OP.validate_call(**ref_kwargs).args).abs().amax(-1)
    fp8_blocks_close(c, "a", got_result, ref_result, block, amax, FP32_ROUNDING)
    c.require(got_result[0].is_contiguous() and got_result[1].is_contiguous(), "results must be contiguous")
    return c.verdict()


def cost(kw: dict) -> tuple[int, int]:
    """(bytes, flops) a kernel must move / do at least."""
    T, H, D = kw["o"].shape
    return T * H * D * 2 + nbytes(kw["positions"]) + T * 64 * 4 + T * H * (D + D // kw["block"] * 4), 0


ERRORS = (
    ("o", change("o", lambda t: t.float())),
    ("o", change("o", lambda t: t[..., :448])),
    ("o", change("o", lambda t: t[:, :0])),
    ("o", change("o", lambda t: t[:, :3])),
    ("o", change("o", lambda t: t[0])),
    ("positions", change("positions", lambda t: t.int())),
    ("positions", change("positions", lambda t: t[:2])),
    ("positions", change("positions", lambda t: t + 64)),
    ("positions", change("positions", lambda t: t - 64)),
    ("cos_sin_cache", change("cos_sin_cache", lambda t: t[:, :32].contiguous())),
    ("cos_sin_cache", change("cos_sin_cache", lambda t: t.double())),
    ("n_groups", set_args(n_groups=0)),
    ("n_groups", set_args(n_groups=2.0)),
    ("block", set_args(block=64)),
    ("block", set_args(block=32.0)),
)

SPEC = OpSpec(
    name="inv_rope_fp8_quant",
    section=8,
    doc="""Undo RoPE on dims 448..511 of every head, then quantize per group to FP8 in 1 x w blocks,
    w = ``block``: 128 (V4) or 32 (V4.1).

    o bf16 [T, H, 512] (last dim contiguous), positions int64 [T], cos_sin_cache fp32 [max_pos, 64],
    n_groups G dividing H. Returns (a float8_e4m3fn [T, G, K], a_scale fp32 [T, G, K/w]) with
    K = H/G * 512: head h is slot h % (H/G) of group h // (H/G); scales are powers of two. These are
    ``fp8_einsum``'s ``a`` and ``a_scale`` (for weights in w x w blocks).""",
    args=(
        Arg("o", Tensor, doc="bf16 [T, H, 512], the attention output"),
        Arg("positions", Tensor, doc="int64 [T]"),
        Arg("cos_sin_cache", Tensor, doc="fp32 [max_pos, 64]"),
        Arg("n_groups", int, keyword_only=True, doc="output groups G (H % G == 0); K = (H/G) * 512 values per group"),
        Arg("block", int, 128, keyword_only=True, doc="activation block width w: 128 (V4) or 32 (V4.1)"),
    ),
    outputs="(Tensor, Tensor)",
    check=check,
    fake=fake,
    reference="dsv4ops.reference.impl.inv_rope_fp8_quant:inv_rope_fp8_quant",
    conformance=Conformance(
        inputs=inputs,
        cases=cases,
        typical=dict(T=4, H=64, n_groups=8),
        compare=compare,
        strides={"o": ("sliced",), "positions": ("sliced", "expanded")},
        stride_bases={"quick": [dict(T=5, H=16, n_groups=2), dict(T=5, H=16, n_groups=2, block=32)],
                      "full": [dict(T=128, H=64, n_groups=8), dict(T=128, H=64, n_groups=8, block=32)]},
        error_base=dict(T=3, H=4, n_groups=2, max_pos=64),
        errors=ERRORS,
    ),
    bench=BenchShapes(
        cost=cost,
        tiny=dict(T=1, H=8, n_groups=1),
        production=(dict(T=128, H=64, n_groups=8), dict(T=4096, H=64, n_groups=8),
                    dict(T=128, H=64, n_groups=8, block=32), dict(T=4096, H=64, n_groups=8, block=32)),
    ),
)
OP = define(SPEC)
