"""A compiled check that tensors still have the structure a call was validated with.

The public functions remember the last few structures they dispatched (per op) together with a
guard: a check, in C++, that each tensor argument has the remembered dtype, device, dispatch keys,
``requires_grad``, sizes and strides. TorchDynamo's ``TensorGuards`` does exactly that, several times
faster than reading the same attributes in Python (docs/perf/README.md, "Decode step and dispatch overhead").

It is private PyTorch API, so it is used only after a self-test proves it accepts the remembered
structure and rejects a changed dtype, size, stride or device; otherwise ``guard_for`` returns None
and calls use the Python structure key alone (same decisions, slower).
"""
from __future__ import annotations

from typing import Callable, Optional, Sequence

import torch


def absent(position: int) -> torch.Tensor:
    """What the guard sees for an absent optional tensor at argument ``position``: a meta tensor of
    its own (the guard refuses one tensor object in two places). That the argument is None is part of
    the remembered scalars, so the guard only compares this tensor with itself."""
    while len(_ABSENT) <= position:
        _ABSENT.append(torch.empty(0, device="meta"))
    return _ABSENT[position]


_ABSENT: list[torch.Tensor] = []


def _tensor_guards() -> Optional[type]:
    try:
        from torch._C._dynamo.guards import TensorGuards
    except ImportError:
        return None
    return TensorGuards


def _build(cls, tensors: Sequence[torch.Tensor]) -> Callable[..., bool]:
    guard = cls(*tensors, dynamic_dims_sizes=[list(t.shape) for t in tensors],
                dynamic_dims_strides=[list(t.stride()) for t in tensors],
                tensor_check_names=[f"arg{i}" for i in range(len(tensors))])
    return guard.check


def _self_test(cls) -> bool:
    """The guard accepts its own structure and rejects every change the structure key would see."""
    try:
        a, b = torch.empty(4, 6), torch.empty(3, dtype=torch.int32)
        none, other = absent(0), absent(1)
        check = _build(cls, [a, b, none, other])
        changed = [torch.empty(4, 6, dtype=torch.float16), torch.empty(4, 7), torch.empty(6, 4).t(),
                   torch.empty(4, 6, device="meta")]
        return (check(torch.empty(4, 6), torch.empty(3, dtype=torch.int32), none, other)
                and not any(check(c, b, none, other) for c in changed)
                and not check(a, b, torch.empty(0), other))
    except Exception:        # any change in the private API's behaviour means: do not use it
        return False


_CLASS = _tensor_guards()
AVAILABLE = _CLASS is not None and _self_test(_CLASS)


def guard_for(tensors: Sequence[torch.Tensor]) -> Optional[Callable[..., bool]]:
    """``check(*tensors) -> bool`` for tensors of exactly this structure, or None when the compiled
    guard is unavailable (the caller then relies on the Python structure key). The check also
    refuses one tensor object passed for two arguments: such calls take the structure key."""
    return _build(_CLASS, tensors) if AVAILABLE else None
