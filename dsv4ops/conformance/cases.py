"""Cases: each op's conformance data (its spec's ``conformance``) made runnable.

Tier ``quick``: small shapes for the CPU (the Triton interpreter in CI; its time: ``dsv4ops check --help``).
Tier ``full``: V4-Flash / V4-Pro production shapes at TP 1-8, for GPUs.
Each tier is the op's own cases followed by its generated stride / alias family (strides.py).
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch

from .. import registry
from .strides import apply as apply_strides, strided_params

TIERS = ("quick", "full")


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
        """The op's keyword arguments for this case, fresh values from ``seed``."""
        return build_inputs(self.op, device, torch.Generator().manual_seed(seed), **self.kwargs)


def build_inputs(op: str, device, gen: torch.Generator, *, strided: str | None = None, **params) -> dict:
    """Keyword arguments of a call of ``op`` from its input builder (``strided="arg:variant"``: one
    argument restrided, strides.py)."""
    kwargs = registry.get_op(op).spec.conformance.inputs(device, gen, **params)
    return kwargs if strided is None else apply_strides(kwargs, strided)


def make_case(op: str, tier: str = "quick", **params) -> Case:
    """A case of ``op`` with the given input-builder parameters (the op's ``conformance.inputs``)."""
    return Case(op, tuple(sorted(params.items())), tier)


def cases(op: str, tier: str = "quick") -> list[Case]:
    if op not in registry.op_names():
        raise ValueError(f"unknown op {op!r}")
    if tier not in TIERS:
        raise ValueError(f"unknown tier {tier!r}; expected one of {TIERS}")
    own = [make_case(op, tier, **params) for params in registry.get_op(op).spec.conformance.cases(tier)]
    return own + [Case(op, params, tier) for params in strided_params(op, tier)]


def typical_case(op: str) -> Case:
    """A small V4-Flash TP1 call of ``op`` (what ``dsv4ops info`` asks ``explain`` about)."""
    return make_case(op, "quick", **registry.get_op(op).spec.conformance.typical)
