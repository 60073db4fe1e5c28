"""``dsv4ops check --repeat N``: a backend's results are bitwise identical across launches, and a
CUDA graph's replay writes exactly what the eager call wrote.

The first eager call of a case (already judged against the reference) is the baseline; each
repeat runs on fresh copies of the same inputs, its output buffer poisoned again; on a CUDA device
the call is then captured on static copies, those are restored to the inputs, and the replay is
compared. Every returned tensor and every tensor the op writes (caches, ``out``, an in-place ``q``)
is compared byte for byte, NaN included.
"""
from __future__ import annotations

import torch

from ..errors import UnsupportedError
from ..tensors import clone_kwargs
from ..tolerance import Verdict


def _tensors(result) -> list:
    return list(result) if isinstance(result, tuple) else [result]


def _same_bits(a, b) -> bool:
    if a is None or b is None:
        return a is None and b is None
    return a.shape == b.shape and a.dtype == b.dtype and torch.equal(
        a.contiguous().view(torch.uint8), b.contiguous().view(torch.uint8))


def differs(op, baseline_kwargs, baseline, kwargs, result) -> str | None:
    """Which returned or written tensor differs from the baseline's, if one does (elements the op's
    contract leaves unspecified, ``conformance.unspecified``, are not compared)."""
    declared = op.spec.conformance.unspecified
    free = declared(baseline_kwargs) if declared is not None else None
    for i, (got, want) in enumerate(zip(_tensors(result), _tensors(baseline))):
        if i == 0 and free is not None and got is not None and want is not None:
            got, want = got.masked_fill(free, 0), want.masked_fill(free, 0)
        if not _same_bits(got, want):
            return f"result {i}"
    for arg in op.spec.written:
        if not _same_bits(kwargs.get(arg.name), baseline_kwargs.get(arg.name)):
            return f"written argument {arg.name!r}"
    return None


def _fresh(op, inputs: dict, poison) -> dict:
    kwargs = clone_kwargs(inputs)
    if kwargs.get("out") is not None:
        poison(kwargs["out"])
    return kwargs


def check_repeatable(op, backend: str, inputs: dict, baseline_kwargs: dict, baseline, times: int,
                     poison) -> Verdict | None:
    """None when ``times - 1`` more launches and (on CUDA) a graph replay reproduce the baseline bit
    for bit; else the failing verdict. ``inputs``: the case's arguments before any call."""
    for launch in range(2, times + 1):
        kwargs = _fresh(op, inputs, poison)
        where = differs(op, baseline_kwargs, baseline, kwargs, op.function(**kwargs, backend=backend))
        if where:
            return Verdict(False, message=f"repeat: launch {launch} of {times} differs from the first in {where}")
    device = next(v.device for v in inputs.values() if isinstance(v, torch.Tensor))
    if device.type != "cuda":
        return None
    static = _fresh(op, inputs, poison)
    op.function(**static, backend=backend)               # compile and load outside the capture
    torch.cuda.synchronize(device)
    written = [a.name for a in op.spec.written if static.get(a.name) is not None]
    restore = lambda: [static[name].copy_(value) for name, value in _fresh(op, inputs, poison).items()
                       if name in written]
    restore()
    graph = torch.cuda.CUDAGraph()
    try:
        with torch.cuda.graph(graph):
            captured = op.function(**static, backend=backend)
    except UnsupportedError as exc:                      # declared cannot_capture: nothing to replay
        return None if "CUDA graph cannot capture" in str(exc) else Verdict(False, message=f"capture: {exc}")
    restore()
    graph.replay()
    torch.cuda.synchronize(device)
    where = differs(op, baseline_kwargs, baseline, static, captured)
    return Verdict(False, message=f"repeat: the graph replay differs from the eager call in {where}") if where else None
