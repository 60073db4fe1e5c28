"""Copies of call arguments that keep their exact layout (verification, the conformance harness,
the bench and the examples each run one call twice on separate buffers)."""
from __future__ import annotations

import torch


def clone_exact(t: torch.Tensor) -> torch.Tensor:
    """A copy of ``t`` with its exact layout: strides, offset and the buffer around it (an expanded
    view stays expanded), which ``Tensor.clone`` does not keep for non-dense views."""
    if t.is_contiguous():
        return t.clone()
    return torch.empty(0, dtype=t.dtype, device=t.device).set_(
        t.untyped_storage().clone(), t.storage_offset(), t.shape, t.stride())


def clone_kwargs(kwargs: dict) -> dict:
    """A copy of an op's arguments with every tensor cloned, layout kept (each run gets its own buffers)."""
    return {k: clone_exact(v) if isinstance(v, torch.Tensor) else v for k, v in kwargs.items()}
