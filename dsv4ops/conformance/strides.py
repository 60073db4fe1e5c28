"""The generated stride / alias family: the same inputs as a base case, one tensor argument made
non-contiguous (docs/ops.md "Strides and aliasing").

An op's spec lists, in ``conformance.strides[arg]``, the layouts the contract accepts for ``arg``
besides contiguous (the first listed is the one the quick tier runs; the full tier runs all), and
in ``conformance.stride_bases[tier]`` the base cases the family is generated on:

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

from .. import registry

@functools.lru_cache(maxsize=None)
def strided_params(op: str, tier: str) -> tuple[tuple, ...]:
    """Builder parameters (sorted items) of the family's cases, on the first base case whose inputs
    have the argument: the full tier takes every accepted layout of every tensor argument, the quick
    tier the first listed one."""
    conformance = registry.get_op(op).spec.conformance
    params, seen = [], set()
    for base in conformance.stride_bases[tier]:
        present = conformance.inputs("cpu", torch.Generator().manual_seed(0), **base)
        for name, variants in conformance.strides.items():
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
            if isinstance(v, torch.Tensor) and v.numel() > 1 and k not in registry.get_op(op).spec.conformance.strides]


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


__all__ = ["strided_params", "contiguous_only", "restride", "apply", "aliased"]
