"""The case matrix per op, generated from docs/ops.md §0 (production shapes) and §1-§5 (corner cases).

Tier ``quick``: small shapes that run in seconds on the CPU (the Triton interpreter in CI).
Tier ``full``: V4-Flash / V4-Pro production shapes at TP 1-8, for GPUs.
"""
from __future__ import annotations

import itertools
from dataclasses import dataclass, field

import torch

from ..ops import OP_NAMES
from .inputs import BUILDERS
from .strides import apply as apply_strides, strided_params

# Spec §0
HEADS_PER_RANK = {"flash": (64, 32, 16, 8), "pro": (128, 64, 32, 16)}   # TP 1, 2, 4, 8
O_GROUPS_PER_RANK = {"flash": (8, 4, 2, 1), "pro": (16, 8, 4, 2)}
INDEX_TOPK = {"flash": 512, "pro": 1024}
WINDOW = 128
SWA_BLOCK = 64
C4_BLOCK, C128_BLOCK = 64, 2
O_LORA_RANK, O_GROUP_K = 1024, 8 * 512
INDEX_HEADS = 64
LAYOUTS = ("fp8_ds_mla", "bf16", "fp8_per_tensor")


@dataclass(frozen=True)
class Case:
    op: str
    params: tuple                      # sorted (name, value) pairs passed to the op's input builder
    tier: str = "quick"
    tags: tuple = field(default=())

    @property
    def kwargs(self) -> dict:
        return dict(self.params)

    @property
    def id(self) -> str:
        parts = []
        for name, value in self.params:
            if isinstance(value, torch.dtype):
                value = str(value).replace("torch.", "")
            parts.append(f"{name}={value}")
        return f"{self.op}[{','.join(parts)}]"

    def build(self, device, seed: int) -> dict:
        gen = torch.Generator().manual_seed(seed)
        params = self.kwargs
        strided = params.pop("strided", None)           # the stride family (conformance/strides.py)
        kwargs = BUILDERS[self.op](device, gen, **params)
        return kwargs if strided is None else apply_strides(kwargs, strided)


def make_case(op: str, tier: str = "quick", **params) -> Case:
    """A case of ``op`` with the given input-builder parameters (see conformance/inputs.py)."""
    return Case(op, tuple(sorted(params.items())), tier)


def _qnorm(tier):
    if tier == "quick":
        yield make_case("qnorm_rope_kv_insert", tier, T=0, H=4, layout="fp8_ds_mla")
        for layout, H, bs in itertools.product(LAYOUTS, (3, 16), (64, 16)):
            yield make_case("qnorm_rope_kv_insert", tier, T=5, H=H, layout=layout, block_size=bs, num_blocks=3,
                        dp_pad=1 if H == 3 else 0, out=bs == 16)
        return
    heads = sorted({h for hs in HEADS_PER_RANK.values() for h in hs})
    for layout, H, T in itertools.product(LAYOUTS, heads, (1, 64)):
        yield make_case("qnorm_rope_kv_insert", tier, T=T, H=H, layout=layout, block_size=SWA_BLOCK, num_blocks=8)
    yield make_case("qnorm_rope_kv_insert", tier, T=300, H=64, layout="fp8_ds_mla", block_size=SWA_BLOCK,
                num_blocks=16, dp_pad=7, out=True)


def _decode(tier):
    op = "sparse_mla_decode"
    if tier == "quick":
        yield make_case(op, tier, T=0, H=4, topk=64, layout="fp8_ds_mla")
        for layout in LAYOUTS:
            yield make_case(op, tier, T=3, H=5, topk=64, layout=layout, extra_topk=64, extra_block_size=C128_BLOCK)
        for corner in ("all_invalid", "pad_middle", "duplicates", "zero_len"):
            yield make_case(op, tier, T=3, H=8, topk=32, layout="fp8_ds_mla", extra_topk=64,
                        extra_block_size=16, corner=corner)
        yield make_case(op, tier, T=2, H=16, topk=64, layout="fp8_ds_mla", sink="inf", lens="full", out=True)
        yield make_case(op, tier, T=2, H=3, topk=32, layout="fp8_ds_mla", sink=None, lens=None)
        for layout in ("bf16", "fp8_per_tensor"):     # the SM100 TRTLLM-gen shape: 128 SWA + extra, no lse
            yield make_case(op, tier, T=3, H=8, topk=WINDOW, layout=layout, extra_topk=64, extra_block_size=C128_BLOCK,
                        need_lse=False)
        yield make_case(op, tier, T=3, H=16, topk=64, layout="fp8_ds_mla", extra_topk=64, extra_block_size=C128_BLOCK,
                    need_lse=False)
        yield make_case(op, tier, T=2, H=8, topk=32, layout="bf16", sink="inf", need_lse=False)   # single segment
        return
    for model, heads in HEADS_PER_RANK.items():
        for H, T in itertools.product(heads, (8, 128)):
            yield make_case(op, tier, T=T, H=H, topk=WINDOW, layout="fp8_ds_mla", block_size=SWA_BLOCK,
                        extra_topk=INDEX_TOPK[model], extra_block_size=C4_BLOCK)
        yield make_case(op, tier, T=64, H=heads[0], topk=WINDOW, layout="fp8_ds_mla", block_size=SWA_BLOCK,
                    extra_topk=128, extra_block_size=C128_BLOCK)           # C128 layer
        yield make_case(op, tier, T=32, H=heads[0], topk=WINDOW, layout="fp8_ds_mla", block_size=SWA_BLOCK)  # SWA only
    for layout in ("bf16", "fp8_per_tensor"):
        for need_lse in (True, False):
            yield make_case(op, tier, T=64, H=64, topk=WINDOW, layout=layout, block_size=SWA_BLOCK, extra_topk=512,
                        extra_block_size=C4_BLOCK, need_lse=need_lse)
    for corner in ("all_invalid", "pad_middle", "duplicates", "zero_len"):
        yield make_case(op, tier, T=16, H=64, topk=WINDOW, layout="fp8_ds_mla", block_size=SWA_BLOCK, extra_topk=512,
                    extra_block_size=C4_BLOCK, corner=corner)
    yield make_case(op, tier, T=16, H=128, topk=WINDOW, layout="fp8_ds_mla", block_size=SWA_BLOCK, extra_topk=1024,
                extra_block_size=C4_BLOCK, sink="inf", out=True)


def _prefill(tier):
    op = "sparse_mla_prefill"
    if tier == "quick":
        yield make_case(op, tier, T=0, H=4, topk=64, layout="fp8_ds_mla")
        for layout in LAYOUTS:
            yield make_case(op, tier, T=3, H=16, topk=64, layout=layout, extra_topk=64, extra_block_size=C128_BLOCK)
        yield make_case(op, tier, T=2, H=64, topk=32, layout="fp8_ds_mla", extra_topk=64, extra_block_size=16)
        yield make_case(op, tier, T=2, H=20, topk=32, layout="bf16", extra_topk=32, extra_block_size=16)
        for corner in ("all_invalid", "pad_middle", "duplicates", "zero_len"):
            yield make_case(op, tier, T=3, H=16, topk=32, layout="fp8_ds_mla", extra_topk=64,
                            extra_block_size=16, corner=corner)
        yield make_case(op, tier, T=2, H=16, topk=64, layout="fp8_ds_mla", sink="inf", lens="full", out=True)
        yield make_case(op, tier, T=2, H=16, topk=32, layout="fp8_ds_mla", sink=None, lens=None)
        yield make_case(op, tier, T=3, H=16, topk=32, layout="bf16", extra_topk=64, extra_block_size=16,
                        need_lse=False)
        return
    for model, heads in HEADS_PER_RANK.items():
        extra = dict(topk=WINDOW, layout="fp8_ds_mla", block_size=SWA_BLOCK, extra_topk=INDEX_TOPK[model],
                     extra_block_size=C4_BLOCK)
        sizes = ((heads[0], 4096), (heads[0], 8192), (heads[1], 4096)) if model == "pro" else \
            ((heads[0], 4096), (heads[1], 4096))
        for H, T in sizes:
            yield make_case(op, tier, T=T, H=H, **extra)
        yield make_case(op, tier, T=2048, H=heads[0], topk=WINDOW, layout="fp8_ds_mla", block_size=SWA_BLOCK,
                        extra_topk=128, extra_block_size=C128_BLOCK)          # C128 layer
        yield make_case(op, tier, T=1024, H=heads[0], topk=WINDOW, layout="fp8_ds_mla", block_size=SWA_BLOCK)
    for layout in ("bf16", "fp8_per_tensor"):
        yield make_case(op, tier, T=1024, H=64, topk=WINDOW, layout=layout, block_size=SWA_BLOCK, extra_topk=512,
                        extra_block_size=C4_BLOCK)
    for corner in ("all_invalid", "pad_middle", "duplicates", "zero_len"):
        yield make_case(op, tier, T=512, H=128, topk=WINDOW, layout="fp8_ds_mla", block_size=SWA_BLOCK,
                        extra_topk=1024, extra_block_size=C4_BLOCK, corner=corner)
    yield make_case(op, tier, T=1024, H=128, topk=WINDOW, layout="fp8_ds_mla", block_size=SWA_BLOCK, extra_topk=1024,
                    extra_block_size=C4_BLOCK, sink="inf", out=True)
    yield make_case(op, tier, T=1024, H=64, topk=WINDOW, layout="fp8_ds_mla", block_size=SWA_BLOCK, extra_topk=512,
                    extra_block_size=C4_BLOCK, sink=None, need_lse=False)


def _logits(tier):
    op = "paged_mqa_logits"
    if tier == "quick":
        yield make_case(op, tier, B=0, next_n=1, context=16, H=4, block_size=16)
        for next_n, lens_dim, clean in itertools.product((1, 2), (1, 2), (False, True)):
            yield make_case(op, tier, B=3, next_n=next_n, context=40, H=8, block_size=16, lens_dim=lens_dim,
                        clean=clean, scale_fmt="ue8m0" if clean else "fp32", out=next_n == 2)
        for corner in ("zero_len", "short", "padded_rows"):
            yield make_case(op, tier, B=3, next_n=2, context=24, H=8, block_size=16, corner=corner, clean=True)
        for lens_dim, clean in ((1, True), (2, False)):   # vLLM's MTP width; 64 heads: rows in 3 chunks + padding
            yield make_case(op, tier, B=2, next_n=6, context=40, H=64, block_size=16, lens_dim=lens_dim, clean=clean)
        return
    for B, next_n, context in itertools.product((4, 64), (1, 2), (2048, 8192)):
        yield make_case(op, tier, B=B, next_n=next_n, context=context, H=INDEX_HEADS, block_size=C4_BLOCK,
                    lens_dim=2, scale_fmt="ue8m0")
    yield make_case(op, tier, B=8, next_n=1, context=4096, H=INDEX_HEADS, block_size=C4_BLOCK, lens_dim=1, clean=True)
    yield make_case(op, tier, B=8, next_n=6, context=4096, H=INDEX_HEADS, block_size=C4_BLOCK, lens_dim=1,
                    clean=True)                                        # vLLM's MTP test width
    for corner in ("zero_len", "short", "padded_rows"):
        yield make_case(op, tier, B=8, next_n=2, context=1024, H=INDEX_HEADS, block_size=C4_BLOCK, corner=corner,
                    clean=True)


def _einsum(tier):
    op = "fp8_einsum"
    if tier == "quick":
        yield make_case(op, tier, B=0, H=2, D=128, R=256)
        yield make_case(op, tier, B=3, H=2, D=128, R=0)                                   # empty sum: exact 0
        yield make_case(op, tier, B=5, H=2, D=128, R=512)
        yield make_case(op, tier, B=3, H=3, D=256, R=256, group_major=True, out=True)
        yield make_case(op, tier, B=4, H=1, D=128, R=384, out_dtype=torch.float32)
        return
    groups = sorted({g for gs in O_GROUPS_PER_RANK.values() for g in gs})
    for G, B in itertools.product(groups, (1, 7, 128)):
        yield make_case(op, tier, B=B, H=G, D=O_LORA_RANK, R=O_GROUP_K, group_major=True)
    yield make_case(op, tier, B=1024, H=8, D=O_LORA_RANK, R=O_GROUP_K)


def _topk(tier):
    op = "indexer_topk"
    if tier == "quick":
        yield make_case(op, tier, R=0, W=64, k=16)
        yield make_case(op, tier, R=4, W=0, k=16, mode="decode2d", next_n=2)                # no column: all -1
        for mode, data in itertools.product(("ranges", "decode1d", "decode2d"), ("random", "ties", "neg_inf")):
            yield make_case(op, tier, R=6, W=300, k=64, mode=mode, next_n=2 if mode != "ranges" else 1, data=data,
                        out=data == "ties")
        for data in ("heavy_tail", "bf16"):
            yield make_case(op, tier, R=4, W=300, k=64, mode="ranges", data=data)
        yield make_case(op, tier, R=4, W=50, k=64, mode="ranges", corner="empty")         # k > W
        yield make_case(op, tier, R=4, W=128, k=32, mode="decode1d", next_n=2, corner="empty")
        yield make_case(op, tier, R=5, W=200, k=16, mode="ranges", column_major=True)
        return
    for model, k in INDEX_TOPK.items():
        for mode, next_n in (("decode2d", 1), ("decode2d", 2), ("decode1d", 2), ("ranges", 1)):
            yield make_case(op, tier, R=128, W=32768, k=k, mode=mode, next_n=next_n)
        for data in ("ties", "heavy_tail", "bf16"):
            yield make_case(op, tier, R=64, W=8192, k=k, mode="decode2d", data=data)
        yield make_case(op, tier, R=64, W=4096, k=k, mode="ranges", data="neg_inf", corner="empty")
    yield make_case(op, tier, R=32, W=700, k=1024, mode="ranges")                       # k > W


def _compress(tier):
    op = "compress_kv_insert"
    if tier == "quick":
        yield make_case(op, tier, layout="fp8_ds_mla", ratio=4, reqs=((0, 0),), block_size=4)
        yield make_case(op, tier, layout="fp8_ds_mla", ratio=4, reqs=((0, 9), (5, 1), (7, 1), (30, 6)), block_size=4,
                        pad=1, dp_pad=1)
        yield make_case(op, tier, layout="index_fp8", ratio=4, reqs=((2, 7), (11, 1), (0, 4)), block_size=8,
                        skip_slot=True, dtype=torch.bfloat16)
        yield make_case(op, tier, layout="fp8_ds_mla", ratio=128, reqs=((100, 30), (127, 1), (0, 3)),
                        block_size=C128_BLOCK)
        yield make_case(op, tier, layout="fp8_ds_mla", ratio=4, decode=6, block_size=4)
        return
    for layout, ratio, bs in (("fp8_ds_mla", 4, C4_BLOCK), ("index_fp8", 4, C4_BLOCK), ("fp8_ds_mla", 128, C128_BLOCK)):
        yield make_case(op, tier, layout=layout, ratio=ratio, decode=128, block_size=bs)   # 128 decode requests
        yield make_case(op, tier, layout=layout, ratio=ratio, reqs=((0, 1500), (513, 700), (4093, 3)),
                        block_size=bs, pad=5, dp_pad=3)                  # prefill chunks
    yield make_case(op, tier, layout="fp8_ds_mla", ratio=4, reqs=((8, 4), (0, 8192)), block_size=C4_BLOCK,
                    dtype=torch.bfloat16, skip_slot=True)


def _inv_rope(tier):
    op = "inv_rope_fp8_quant"
    if tier == "quick":
        yield make_case(op, tier, T=0, H=8, n_groups=1)
        yield make_case(op, tier, T=5, H=16, n_groups=2)
        yield make_case(op, tier, T=3, H=6, n_groups=3, head_stride=8, corner="zero_head")
        yield make_case(op, tier, T=4, H=8, n_groups=8)
        return
    for model, heads in HEADS_PER_RANK.items():
        for H, G in zip(heads, O_GROUPS_PER_RANK[model]):
            for T in (1, 128):
                yield make_case(op, tier, T=T, H=H, n_groups=G)
    yield make_case(op, tier, T=2048, H=64, n_groups=8, corner="zero_head")
    yield make_case(op, tier, T=64, H=64, n_groups=8, head_stride=72)


def _mqa_logits(tier):
    op = "mqa_logits"
    if tier == "quick":
        yield make_case(op, tier, T=0, S=16, H=4)
        yield make_case(op, tier, T=3, S=0, H=4, clean=True)
        for ranges, clean in itertools.product(("causal", "requests", "random"), (False, True)):
            yield make_case(op, tier, T=9, S=40, H=8, ranges=ranges, clean=clean, scale_fmt="ue8m0" if clean else "fp32",
                            out=ranges == "random")
        yield make_case(op, tier, T=4, S=48, H=INDEX_HEADS, ranges="causal", clean=True)
        yield make_case(op, tier, T=8, S=40, H=8, ranges="random", corner="empty", clean=True)
        yield make_case(op, tier, T=6, S=33, H=5, corner="full")
        yield make_case(op, tier, T=5, S=24, H=8, flavour="fnuz", clean=True)
        yield make_case(op, tier, T=16, S=96, H=8, ranges="requests", topk=16)          # -> indexer_topk
        return
    yield make_case(op, tier, T=4096, S=32768, H=INDEX_HEADS, ranges="causal")            # the bench shape
    yield make_case(op, tier, T=8192, S=65536, H=INDEX_HEADS, ranges="causal", scale_fmt="ue8m0")
    yield make_case(op, tier, T=8192, S=65536, H=INDEX_HEADS, ranges="requests")
    yield make_case(op, tier, T=8192, S=2048, H=INDEX_HEADS, ranges="causal", clean=True)   # S = T / 4: zero-length rows
    yield make_case(op, tier, T=2048, S=16384, H=INDEX_HEADS, ranges="random", corner="empty", clean=True)
    yield make_case(op, tier, T=1000, S=7777, H=INDEX_HEADS, ranges="requests", clean=True, out=True)
    for k in INDEX_TOPK.values():
        yield make_case(op, tier, T=4096, S=16384, H=INDEX_HEADS, ranges="requests", topk=k)


_GENERATORS = {
    "qnorm_rope_kv_insert": _qnorm,
    "sparse_mla_decode": _decode,
    "sparse_mla_prefill": _prefill,
    "paged_mqa_logits": _logits,
    "fp8_einsum": _einsum,
    "indexer_topk": _topk,
    "compress_kv_insert": _compress,
    "inv_rope_fp8_quant": _inv_rope,
    "mqa_logits": _mqa_logits,
}
TIERS = ("quick", "full")


def cases(op: str, tier: str = "quick") -> list[Case]:
    if op not in OP_NAMES:
        raise ValueError(f"unknown op {op!r}")
    if tier not in TIERS:
        raise ValueError(f"unknown tier {tier!r}; expected one of {TIERS}")
    family = [Case(op, params, tier) for params in strided_params(op, tier)]
    return list(_GENERATORS[op](tier)) + family


def typical_case(op: str) -> Case:
    """A small V4-Flash TP1 call of ``op`` (what ``dsv4ops info`` asks ``explain`` about)."""
    return {
        "qnorm_rope_kv_insert": make_case("qnorm_rope_kv_insert", "quick", T=4, H=64, layout="fp8_ds_mla",
                                      block_size=SWA_BLOCK),
        "sparse_mla_decode": make_case("sparse_mla_decode", "quick", T=4, H=64, topk=WINDOW, layout="fp8_ds_mla",
                                   block_size=SWA_BLOCK, extra_topk=512, extra_block_size=C4_BLOCK),
        "sparse_mla_prefill": make_case("sparse_mla_prefill", "quick", T=64, H=64, topk=WINDOW, layout="fp8_ds_mla",
                                          block_size=SWA_BLOCK, extra_topk=512, extra_block_size=C4_BLOCK),
        "paged_mqa_logits": make_case("paged_mqa_logits", "quick", B=2, next_n=1, context=256, H=INDEX_HEADS,
                                  block_size=C4_BLOCK),
        "fp8_einsum": make_case("fp8_einsum", "quick", B=4, H=8, D=O_LORA_RANK, R=O_GROUP_K),
        "indexer_topk": make_case("indexer_topk", "quick", R=4, W=1024, k=512, mode="decode2d"),
        "inv_rope_fp8_quant": make_case("inv_rope_fp8_quant", "quick", T=4, H=64, n_groups=8),
        "compress_kv_insert": make_case("compress_kv_insert", "quick", layout="fp8_ds_mla", ratio=4,
                                        reqs=((3, 1), (7, 1)), block_size=C4_BLOCK),
        "mqa_logits": make_case("mqa_logits", "quick", T=64, S=256, H=INDEX_HEADS),
    }[op]
