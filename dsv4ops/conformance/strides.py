"""The generated stride / alias family: the same inputs as a base case, one tensor argument made
non-contiguous (docs/ops.md "Strides and aliasing").

``LAYOUTS[op][arg]`` lists the layouts the contract accepts for ``arg`` besides contiguous (the
first listed is the one the quick tier runs; the full tier runs all):

- ``sliced``: a view into a wider buffer (``torch.cat([t, t.flip(-1)], -1)[..., :n]``, the way engines
  slice a per-request block table; 1-D: every other element). The gaps hold legal but wrong values,
  so a kernel that ignores the strides computes a wrong result instead of crashing.
- ``transposed``: the same values stored with the dimensions reversed (MN-major scales).
- ``expanded``: row 0 broadcast over dim 0 (stride 0; read-only arguments only).

Every other tensor argument (``numel > 1``) must be contiguous: its ``sliced`` view is an error input
(an ``InputError`` naming it). A case selects one variant with the parameter ``strided="arg:variant"``.
"""
from __future__ import annotations

import functools

import torch

from .inputs import BUILDERS

_SPARSE_MLA = {"indices": ("sliced", "transposed", "expanded"), "topk_lens": ("sliced",),
               "attn_sink": ("sliced", "expanded"), "extra_indices": ("sliced", "transposed"),
               "extra_topk_lens": ("sliced",)}
LAYOUTS = {
    "qnorm_rope_kv_insert": {"kv": ("sliced", "expanded"), "positions": ("expanded", "sliced"),
                             "slot_mapping": ("sliced",)},
    "sparse_mla_decode": _SPARSE_MLA,
    "sparse_mla_prefill": _SPARSE_MLA,           # the same arguments and checks
    "paged_mqa_logits": {"weights": ("sliced", "transposed", "expanded"),
                         "context_lens": ("sliced", "transposed", "expanded"),
                         "block_table": ("sliced", "transposed", "expanded")},
    "fp8_einsum": {"a": ("sliced",), "a_scale": ("transposed", "sliced", "expanded"),       # MN-major first
                   "b_scale": ("transposed", "sliced", "expanded"), "out": ("sliced",)},
    "indexer_topk": {"logits": ("transposed", "sliced"), "row_starts": ("sliced",), "row_ends": ("sliced",),
                     "seq_lens": ("sliced", "transposed")},
    "inv_rope_fp8_quant": {"o": ("sliced",), "positions": ("sliced", "expanded")},
    "compress_kv_insert": {"kv": ("sliced",), "score": ("sliced",), "positions": ("sliced", "expanded"),
                           "norm_weight": ("sliced", "expanded"), "state_cache": ("sliced",),
                           # the state table and token_to_req not expanded: requests own disjoint state pages
                           # (docs/ops.md) and a token pools its own request's; a broadcast row or request
                           # makes tokens pool state rows another request wrote, or none did (poisoned)
                           "state_slot_mapping": ("sliced",), "state_block_table": ("sliced", "transposed"),
                           "token_to_req": ("sliced",), "slot_mapping": ("sliced",)},
}

# Base cases (input-builder parameters) per op and tier; each tensor argument's variants are taken
# from the first base that has the argument.
BASES = {
    "quick": {
        "qnorm_rope_kv_insert": [dict(T=5, H=3, layout="fp8_ds_mla", block_size=16, num_blocks=3, out=True)],
        "sparse_mla_decode": [dict(T=3, H=5, topk=32, layout="fp8_ds_mla", block_size=16, extra_topk=32,
                                   extra_block_size=16, out=True)],
        "sparse_mla_prefill": [dict(T=3, H=16, topk=32, layout="fp8_ds_mla", block_size=16, extra_topk=32,
                                    extra_block_size=16, out=True)],
        "paged_mqa_logits": [dict(B=3, next_n=3, context=40, H=4, block_size=16, lens_dim=2, clean=True, out=True)],
        "fp8_einsum": [dict(B=5, H=2, D=256, R=256, out=True)],
        "indexer_topk": [dict(R=6, W=300, k=16, mode="ranges", out=True),
                         dict(R=6, W=300, k=16, mode="decode2d", next_n=2)],
        "inv_rope_fp8_quant": [dict(T=5, H=16, n_groups=2)],
        "compress_kv_insert": [dict(layout="fp8_ds_mla", ratio=4, reqs=((2, 7), (9, 1), (0, 4)), block_size=4, pad=1)],
    },
    "full": {
        "qnorm_rope_kv_insert": [dict(T=64, H=64, layout="fp8_ds_mla", block_size=64, num_blocks=8, out=True)],
        "sparse_mla_decode": [dict(T=32, H=64, topk=128, layout="fp8_ds_mla", block_size=64, extra_topk=512,
                                   extra_block_size=64, out=True)],
        "sparse_mla_prefill": [dict(T=512, H=64, topk=128, layout="fp8_ds_mla", block_size=64, extra_topk=512,
                                    extra_block_size=64, out=True)],
        "paged_mqa_logits": [dict(B=8, next_n=2, context=2048, H=64, block_size=64, lens_dim=2, clean=True,
                                  out=True)],
        "fp8_einsum": [dict(B=64, H=8, D=1024, R=4096, out=True)],
        "indexer_topk": [dict(R=64, W=8192, k=512, mode="ranges", out=True),
                         dict(R=64, W=8192, k=512, mode="decode2d", next_n=2)],
        "inv_rope_fp8_quant": [dict(T=128, H=64, n_groups=8)],
        "compress_kv_insert": [dict(layout="fp8_ds_mla", ratio=4, reqs=((0, 700), (513, 300)), decode=32,
                                    block_size=64, pad=3)],
    },
}


@functools.lru_cache(maxsize=None)
def strided_params(op: str, tier: str) -> tuple[tuple, ...]:
    """Builder parameters (sorted items) of the family's cases, on the first base case whose inputs
    have the argument: the full tier takes every accepted layout of every tensor argument, the quick
    tier the first listed one."""
    params, seen = [], set()
    for base in BASES[tier].get(op, ()):
        present = BUILDERS[op]("cpu", torch.Generator().manual_seed(0), **base)
        for name, variants in LAYOUTS[op].items():
            if name in seen or present.get(name) is None:
                continue
            seen.add(name)
            if tier == "quick":
                variants = variants[:1]
            params += [tuple(sorted({**base, "strided": f"{name}:{v}"}.items())) for v in variants]
    return tuple(params)


def contiguous_only(op: str, kwargs: dict) -> list[str]:
    """The tensor arguments of ``kwargs`` that must be contiguous (their ``sliced`` view is rejected)."""
    return [k for k, v in kwargs.items()
            if isinstance(v, torch.Tensor) and v.numel() > 1 and k not in LAYOUTS.get(op, {})]


def restride(t: torch.Tensor, variant: str) -> torch.Tensor:
    """``t``'s values in the layout ``variant`` (see the module docstring)."""
    bits = t.view(torch.uint8) if t.element_size() == 1 and t.dtype != torch.uint8 else t
    if variant == "sliced":
        if t.dim() == 1:
            out = torch.stack([bits, bits.flip(0)], 1).reshape(-1)[::2]
        else:
            out = torch.cat([bits, bits.flip(-1)], -1)[..., : t.shape[-1]]
    elif variant == "transposed":
        rev = list(range(t.dim()))[::-1]
        out = bits.permute(rev).contiguous().permute(rev)
    elif variant == "expanded":
        out = bits[:1].expand(bits.shape)
    else:
        raise ValueError(f"unknown layout variant {variant!r}")
    return out.view(t.dtype) if out.dtype != t.dtype else out


def apply(kwargs: dict, strided: str) -> dict:
    """``kwargs`` with the argument named in ``strided="arg:variant"`` restrided."""
    name, _, variant = strided.partition(":")
    return {**kwargs, name: restride(kwargs[name], variant)}


def aliased(kwargs: dict, written: str, other: str) -> dict:
    """``kwargs`` with the written argument and ``other`` placed at the start of one byte buffer
    (both contiguous, ``other`` keeping its values): an overlap validation must refuse."""
    w, x = kwargs[written], kwargs[other]
    buf = torch.zeros(max(w.numel() * w.element_size(), x.numel() * x.element_size()), dtype=torch.uint8,
                      device=x.device)
    x_view = buf[: x.numel() * x.element_size()].view(x.dtype).view(x.shape)
    x_view.copy_(x)
    return {**kwargs, written: buf[: w.numel() * w.element_size()].view(w.dtype).view(w.shape), other: x_view}


def clone_exact(t: torch.Tensor) -> torch.Tensor:
    """A copy of ``t`` with its exact layout: strides, offset and the buffer around it (an expanded
    view stays expanded), which ``Tensor.clone`` does not keep for non-dense views."""
    if t.is_contiguous():
        return t.clone()
    return torch.empty(0, dtype=t.dtype, device=t.device).set_(
        t.untyped_storage().clone(), t.storage_offset(), t.shape, t.stride())


__all__ = ["LAYOUTS", "BASES", "strided_params", "contiguous_only", "restride", "apply", "aliased", "clone_exact"]
