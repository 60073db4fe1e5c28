"""Op 11 (docs/ops.md §11): prefill lightning-indexer weighted-ReLU MQA logits over contiguous FP8 or MXFP4 keys."""
from __future__ import annotations

import itertools
from typing import Optional

import torch
from torch import Tensor

from .. import formats
from ..checker import Checker
from ..index_checks import check_query
from ..cost import nbytes
from ..opspec import Arg, BenchShapes, Conformance, OpSpec, define
from ..quant import FP8_MAX, encode_mxfp4, to_fp8, ue8m0_scale
from ..sampling import FP8_NAN, change, index_query, key_ranges, randn, set_args, to_device
from ..shapes import INDEX_HEADS, INDEX_TOPK, V41_INDEX_HEADS
from ..tolerance import Collector, Verdict, fp8_abs, indexer_logits_rule, topk_selection

FP8_TYPES = (torch.float8_e4m3fn, torch.float8_e4m3fnuz)     # OCP e4m3, or FNUZ e4m3 (gfx942)


MXFP4 = torch.uint8                  # packed e2m1 queries / keys (two values a byte)


def check(c: Checker, a):
    c.tensor("q", a.q, dtype=(*FP8_TYPES, MXFP4), shape=("T", "H", None), anchor=True, contiguous=True)
    c.tensor("k", a.k, dtype=(*FP8_TYPES, MXFP4), shape=("S", None), contiguous=True)
    mxfp4_keys = a.k.dtype == MXFP4
    check_query(c, a.q, a.q_scale, ("T",), mxfp4_keys)
    if a.q.dtype != MXFP4:
        c.tensor("q", a.q, shape=("T", "H", formats.INDEX_DIM))
    T, H = a.q.shape[:2]
    if H < 1:
        c.fail("q", f"must have at least one head, got H={H}")
    if mxfp4_keys:
        c.tensor("k", a.k, shape=("S", formats.INDEX_DIM // 2))
        if a.q.dtype not in (torch.float8_e4m3fn, MXFP4):
            c.fail("q", f"must be float8_e4m3fn or MXFP4 (uint8) with MXFP4 keys, got {a.q.dtype}")
        S = a.k.shape[0]
        c.tensor("k_scale", a.k_scale, dtype=torch.uint8, shape=(S, formats.INDEX_DIM // formats.MX_BLOCK),
                 contiguous=True)
    else:
        c.tensor("k", a.k, dtype=a.q.dtype, shape=("S", formats.INDEX_DIM))
        S = a.k.shape[0]
        c.tensor("k_scale", a.k_scale, dtype=torch.float32, shape=(S,), contiguous=True)
    c.tensor("weights", a.weights, dtype=torch.float32, shape=(T, H), last_dim_contiguous=True)
    c.tensor("ks", a.ks, dtype=torch.int32, shape=(T,))
    c.tensor("ke", a.ke, dtype=torch.int32, shape=(T,))
    c.bool_arg("clean", a.clean)
    c.out_buffer(a.out, dtype=torch.float32, shape=(T, S))
    c.in_range("ks", a.ks, 0, S + 1, what=f"range starts (at most the key count S={S})")
    c.in_range("ke", a.ke, 0, S + 1, what=f"range ends (at most the key count S={S})")
    c.not_above("ks", a.ks, "ke", a.ke)
    if S and T and not mxfp4_keys and c.values_checked(a.k_scale):   # keys no row's range covers are never read
        edges = torch.zeros(S + 1, dtype=torch.int64, device=a.ks.device)
        edges.index_add_(0, a.ks.long(), torch.ones_like(a.ks, dtype=torch.int64))
        edges.index_add_(0, a.ke.long(), -torch.ones_like(a.ke, dtype=torch.int64))
        covered = edges.cumsum(0)[:S] > 0
        c.finite_positive("k_scale", a.k_scale[covered.to(a.k_scale.device)],
                          what="scales of the keys some row's [ks, ke) covers")
    return a


def fake(a):
    return a.weights.new_empty(a.q.shape[0], a.k.shape[0], dtype=torch.float32)


# ---------------------------------------------------------------------------------------------
# Conformance: sample inputs, cases, comparison rule, error inputs, bench shapes

def inputs(device, gen, *, T, S, H=64, ranges="causal", scale_fmt="fp32", flavour="ocp", keys="fp8", q_fmt="fp8",
           clean=False, corner=None, out=False, topk=None):
    """``keys``: fp8 (``scale_fmt``, ``flavour``) or mxfp4; ``q_fmt``: fp8 or mxfp4. ``topk`` is read by
    the comparison rule only: it also feeds the logits to indexer_topk (ranges mode) and judges the
    pair end to end. Keys and scales no row's range covers are NaN (a kernel may read them only for
    columns it does not return)."""
    q, q_scale = index_query(randn(gen, T, H, 128) * 3, q_fmt, flavour)
    fp32_keys = randn(gen, S, 128) * (0.05 + torch.rand(S, 1, generator=gen))
    if keys == "mxfp4":
        k, scale = encode_mxfp4(fp32_keys)
    else:
        amax = fp32_keys.abs().amax(-1).clamp_min(formats.AMAX_FLOOR)
        scale = amax / FP8_MAX[flavour] if scale_fmt == "fp32" else ue8m0_scale(amax, flavour)[0]
        k = to_fp8(fp32_keys / scale[:, None], flavour)
    ks, ke = key_ranges(gen, T, S, ranges)
    if corner == "empty":                       # ks == ke rows, at several offsets
        ke[::2] = ks[::2]
    elif corner == "full":
        ks[:], ke[:] = 0, S
    covered = torch.zeros(S + 1, dtype=torch.int64).index_add_(0, ks, torch.ones(T, dtype=torch.int64))
    covered = (covered.index_add_(0, ke, -torch.ones(T, dtype=torch.int64)).cumsum(0) > 0)[:S]
    if keys == "mxfp4":
        scale[~covered] = 255                   # UE8M0 NaN
    else:
        k.view(torch.uint8)[~covered] = FP8_NAN[flavour]
        scale[~covered] = float("nan")
    kwargs = dict(q=q, k=k, k_scale=scale, weights=randn(gen, T, H) * 0.2, ks=ks.to(torch.int32),
                  ke=ke.to(torch.int32), q_scale=q_scale, clean=clean)
    if out:
        kwargs["out"] = torch.empty(T, S)
    return to_device(kwargs, device)


def cases(tier: str):
    if tier == "quick":
        yield dict(T=0, S=16, H=4)
        yield dict(T=3, S=0, H=4, clean=True)
        for ranges, clean in itertools.product(("causal", "requests", "random"), (False, True)):
            yield dict(T=9, S=40, H=8, ranges=ranges, clean=clean, scale_fmt="ue8m0" if clean else "fp32",
                       out=ranges == "random")
        yield dict(T=4, S=48, H=INDEX_HEADS, ranges="causal", clean=True)
        yield dict(T=8, S=40, H=8, ranges="random", corner="empty", clean=True)
        yield dict(T=6, S=33, H=5, corner="full")
        yield dict(T=5, S=24, H=8, flavour="fnuz", clean=True)
        yield dict(T=16, S=96, H=8, ranges="requests", topk=16)          # -> indexer_topk
        for q_fmt, ranges in itertools.product(("fp8", "mxfp4"), ("causal", "requests", "random")):   # V4.1
            yield dict(T=9, S=40, H=V41_INDEX_HEADS, keys="mxfp4", q_fmt=q_fmt, ranges=ranges, clean=ranges != "random",
                       out=ranges == "requests")
        yield dict(T=8, S=40, H=5, keys="mxfp4", q_fmt="mxfp4", ranges="random", corner="empty", clean=True)
        yield dict(T=3, S=0, H=V41_INDEX_HEADS, keys="mxfp4", q_fmt="mxfp4", clean=True)
        yield dict(T=16, S=96, H=V41_INDEX_HEADS, keys="mxfp4", q_fmt="mxfp4", ranges="requests", topk=16)
        return
    yield dict(T=4096, S=32768, H=INDEX_HEADS, ranges="causal")            # the bench shape
    yield dict(T=8192, S=65536, H=INDEX_HEADS, ranges="causal", scale_fmt="ue8m0")
    yield dict(T=8192, S=65536, H=INDEX_HEADS, ranges="requests")
    yield dict(T=8192, S=2048, H=INDEX_HEADS, ranges="causal", clean=True)   # S = T / 4: zero-length rows
    yield dict(T=2048, S=16384, H=INDEX_HEADS, ranges="random", corner="empty", clean=True)
    yield dict(T=1000, S=7777, H=INDEX_HEADS, ranges="requests", clean=True, out=True)
    for k in INDEX_TOPK.values():
        yield dict(T=4096, S=16384, H=INDEX_HEADS, ranges="requests", topk=k)
    v41 = dict(H=V41_INDEX_HEADS, keys="mxfp4")                                 # DeepSeek-V4.1
    for q_fmt in ("fp8", "mxfp4"):
        yield dict(T=4096, S=32768, ranges="causal", q_fmt=q_fmt, **v41)
        yield dict(T=8192, S=65536, ranges="requests", q_fmt=q_fmt, clean=True, **v41)
    yield dict(T=8192, S=8192, ranges="causal", q_fmt="mxfp4", clean=True, **v41)    # ratio 1: S = T
    yield dict(T=2048, S=16384, ranges="random", corner="empty", q_fmt="mxfp4", clean=True, **v41)
    yield dict(T=4096, S=16384, ranges="requests", q_fmt="mxfp4", topk=512, **v41)


def compare(params, ref_kwargs, ref_result, got_kwargs, got_result) -> Verdict:
    """The paged_mqa_logits rule on [ks, ke); clean=True: -inf exactly outside. Cases with ``topk``
    also select the top ``topk`` of the logits with the reference indexer_topk (ranges mode) and judge
    the selection against the reference logits, allowing swaps of logits within their two error bounds."""
    c = Collector()
    kw = ref_kwargs
    mag = indexer_logits_rule(c, ref_result, got_result, lambda: magnitude(kw), kw["clean"],
                              "columns outside [ks, ke)")
    k = params.get("topk")
    if k and not c.failures:
        from ..reference.impl.indexer_topk import top_k     # at run time: the reference package imports every op
        starts, ends = kw["ks"].to(torch.int64), kw["ke"].to(torch.int64)
        slack = torch.zeros_like(ref_result) if mag is None else 1e-4 * mag
        topk_selection(c, ref_result, k, starts, ends, top_k(got_result, k, starts, ends), slack,
                       "indexer_topk(mqa_logits)")
    return c.verdict()


def unspecified(kw: dict):
    """Without ``clean``, the columns outside each row's [ks, ke) (None: every element is specified)."""
    if kw["clean"]:
        return None
    cols = torch.arange(kw["k"].shape[0], device=kw["ks"].device)[None, :]
    return (cols < kw["ks"].long()[:, None]) | (cols >= kw["ke"].long()[:, None])


def magnitude(kw: dict) -> torch.Tensor:
    """fp32 [T, S]: sum_h |w_h| sum_d |q_hd| |k_d| on [ks, ke) (the reference on the inputs'
    magnitudes), the scale of the logits' error bound."""
    k_scale = kw["k_scale"] if kw["k"].dtype == MXFP4 else kw["k_scale"].abs()
    return OP.reference(fp8_abs(kw["q"]), fp8_abs(kw["k"]), k_scale, kw["weights"].abs(), kw["ks"], kw["ke"],
                        q_scale=kw.get("q_scale"))


def cost(kw: dict) -> tuple[int, int]:
    """(bytes, flops) a kernel must move / do at least."""
    (T, H), S = kw["q"].shape[:2], kw["k"].shape[0]
    pairs = int((kw["ke"].long() - kw["ks"].long()).sum())          # (row, key) scores in the ranges
    written = T * S if kw["clean"] else pairs
    moved = nbytes(kw["q"], kw.get("q_scale"), kw["k"], kw["k_scale"], kw["weights"], kw["ks"], kw["ke"]) + written * 4
    return moved, 2 * pairs * H * formats.INDEX_DIM


ERRORS = (
    ("q", change("q", lambda t: t.float())),
    ("q", change("q", lambda t: t[..., :64].contiguous())),
    ("q", change("q", lambda t: t.transpose(0, 1).contiguous().transpose(0, 1))),
    ("k", change("k", lambda t: t.view(torch.uint8))),
    ("k", change("k", lambda t: t.float().to(torch.float8_e4m3fnuz))),
    ("k", change("k", lambda t: t[:, :64].contiguous())),
    ("k_scale", change("k_scale", lambda t: t[:-1])),
    ("k_scale", change("k_scale", lambda t: t.double())),
    ("weights", change("weights", lambda t: t[:, :2])),
    ("weights", change("weights", lambda t: t.bfloat16())),
    ("ks", change("ks", lambda t: t.long())),
    ("ke", change("ke", lambda t: t[:3])),
    ("ke", change("ke", lambda t: t + 1000)),
    ("ks", change("ks", lambda t: t - 1000)),
    ("ks", lambda kw: kw.update(ks=torch.full_like(kw["ks"], 9), ke=torch.full_like(kw["ke"], 5))),
    ("clean", set_args(clean="yes")),
    ("out", set_args(out=torch.empty(5, 39))),
    ("out", set_args(out=torch.empty(5, 40, dtype=torch.float64))),
    ("q", change("q", lambda t: t[:, :0])),                                   # H = 0
    ("k_scale", change("k_scale", lambda t: t.neg())),                         # <= 0 on covered keys
    ("k_scale", change("k_scale", lambda t: torch.zeros_like(t))),
    ("q_scale", set_args(q_scale=torch.zeros(5, 4, 4, dtype=torch.uint8))),        # with fp8 q
)


def on_mxfp4(edit):
    """An error input on MXFP4 keys and queries: the base call's keys and q re-quantized, then ``edit``."""
    def change_call(kw):
        kw["k"], kw["k_scale"] = encode_mxfp4(formats.index_vectors(kw["k"], kw["k_scale"]).nan_to_num())
        kw["q"], kw["q_scale"] = index_query(kw["q"].float(), "mxfp4")
        edit(kw)
    return change_call


ERRORS += (
    ("q_scale", on_mxfp4(set_args(q_scale=None))),
    ("q_scale", on_mxfp4(change("q_scale", lambda t: t[..., :3].contiguous()))),
    ("k_scale", on_mxfp4(change("k_scale", lambda t: t.view(torch.int32)))),
    ("k_scale", on_mxfp4(change("k_scale", lambda t: t[:-1]))),
    ("k", on_mxfp4(change("k", lambda t: t[:, :32].contiguous()))),
    ("q", on_mxfp4(lambda kw: kw.update(q=to_fp8(kw["q"].float()).to(torch.float8_e4m3fnuz), q_scale=None))),
    ("q", on_mxfp4(lambda kw: kw.update(k=to_fp8(torch.ones(kw["k"].shape[0], 128)), k_scale=torch.ones(kw["k"].shape[0])))),
)

SPEC = OpSpec(
    name="mqa_logits",
    section=11,
    doc="""q fp8 [T, H, 128], or MXFP4 packed e2m1 uint8 [T, H, 64] with q_scale UE8M0 uint8 [T, H, 4];
    k fp8 [S, 128] (q's fp8 type) with k_scale fp32 [S] (positive), or MXFP4 keys: k uint8 [S, 64]
    with k_scale UE8M0 uint8 [S, 4] (MXFP4 q needs these); weights fp32 [T, H]; ks, ke int32 [T] with
    0 <= ks <= ke <= S. Returns fp32 [T, S]: ``out[t, s] = sum_h weights[t, h] * relu(Q[t, h] . K[s])``
    (the dequantized vectors) for ks[t] <= s < ke[t]; other columns unspecified, or exactly -inf with
    ``clean=True``.""",
    args=(
        Arg("q", Tensor, doc="fp8 [T, H, 128] (float8_e4m3fn, or float8_e4m3fnuz on gfx942), or MXFP4 packed e2m1 "
                             "uint8 [T, H, 64]; contiguous, H >= 1"),
        Arg("k", Tensor, doc="the keys, contiguous: q's fp8 type [S, 128], or MXFP4 packed e2m1 uint8 [S, 64]"),
        Arg("k_scale", Tensor, doc="fp8 keys: fp32 [S], positive per-key scales; MXFP4 keys: UE8M0 uint8 [S, 4]; "
                                   "contiguous"),
        Arg("weights", Tensor, doc="fp32 [T, H] (last dim contiguous), per-head weights"),
        Arg("ks", Tensor, doc="int32 [T], first key of each row's range"),
        Arg("ke", Tensor, doc="int32 [T], end of each row's key range (ks <= ke <= S)"),
        Arg("q_scale", Optional[Tensor], None, keyword_only=True,
            doc="MXFP4 q only: UE8M0 bytes uint8 [T, H, 4] contiguous (byte j scales values 32j..32j+31)"),
        Arg("clean", bool, False, keyword_only=True, doc="write exactly -inf outside [ks, ke)"),
        Arg("out", Optional[Tensor], None, keyword_only=True, mutated=True,
            doc="fp32 [T, S] contiguous, or None to allocate"),
    ),
    outputs="Tensor",
    check=check,
    fake=fake,
    reference="dsv4ops.reference.impl.mqa_logits:mqa_logits",
    conformance=Conformance(
        inputs=inputs,
        cases=cases,
        typical=dict(T=64, S=256, H=INDEX_HEADS),
        compare=compare,
        strides={"weights": ("sliced", "expanded"), "ks": ("sliced", "expanded"), "ke": ("sliced",)},
        stride_bases={"quick": (dict(T=9, S=40, H=8, ranges="random", clean=True, out=True),),
                      "full": (dict(T=1000, S=7777, H=INDEX_HEADS, ranges="requests", clean=True, out=True),)},
        error_base=dict(T=5, S=40, H=4, ranges="random"),
        errors=ERRORS,
        unspecified=unspecified,
    ),
    bench=BenchShapes(
        cost=cost,
        tiny=dict(T=4, S=64, H=64),
        production=(dict(T=4096, S=32768, H=64, ranges="causal"),
                    dict(T=4096, S=32768, H=V41_INDEX_HEADS, ranges="causal", keys="mxfp4", q_fmt="mxfp4")),
        sweep=tuple(dict(T=T, S=S, H=64, ranges=r) for T, S in ((1024, 8192), (4096, 32768), (8192, 65536))
                    for r in ("causal", "requests"))
        + tuple(dict(T=T, S=S, H=V41_INDEX_HEADS, ranges="causal", keys="mxfp4", q_fmt=q_fmt)
                for T, S in ((4096, 8192), (8192, 65536)) for q_fmt in ("fp8", "mxfp4")),
        matrix="fp8",
    ),
)
OP = define(SPEC)
