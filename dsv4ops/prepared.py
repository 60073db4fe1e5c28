"""Prepared calls: validate and choose once, then run with no per-call Python checks.

    decode = dsv4ops.prepare("sparse_mla_decode", q, swa, idx, lens, layout="fp8_ds_mla", ...)
    out, lse = decode(q=q2, kv_cache=swa, indices=idx2, topk_lens=lens2, ...)   # checked
    out, lse = decode.run(q=q2, kv_cache=swa, indices=idx2, topk_lens=lens2, ...)   # unchecked

An engine binds one per layer and call site at start-up (or before CUDA-graph capture). ``__call__``
verifies that the arguments have the structure (dtypes, devices, shapes, strides, scalars) that was
validated and raises ``InputError`` otherwise; ``run`` trusts the caller and costs what calling the
vendor kernel directly costs.
"""
from __future__ import annotations

import torch

from .device_guard import run_on
from .errors import InputError
from .ops import OPS
from .selection import Decision, decide, structure


class PreparedOp:
    def __init__(self, op: str, decision: Decision, kwargs: dict, device: torch.device):
        self.op = op
        self.decision = decision
        self.backend = decision.backend
        self._fn = decision.selected.fn
        self.device = device
        self._defaults = {k: v for k, v in kwargs.items() if not isinstance(v, torch.Tensor)}
        self._names = tuple(kwargs)                  # the validated argument order
        self._structure = structure(kwargs, cpu_ok=True)

    def run(self, **kwargs):
        """Call the chosen implementation; the arguments must match the prepared structure."""
        return run_on(self.device, self._fn, {**self._defaults, **kwargs})

    def __call__(self, **kwargs):
        full = {**self._defaults, **kwargs}
        same_names = set(full) == set(self._names)
        if not same_names or structure({n: full[n] for n in self._names}, cpu_ok=True) != self._structure:
            raise InputError(f"{self.op}: arguments differ in dtype, device, shape, strides or a scalar from "
                             f"the ones this call was prepared with; prepare a new call for them")
        return run_on(self.device, self._fn, full)

    def __repr__(self) -> str:
        return f"PreparedOp({self.op} -> {self.backend})"


def prepare(op_name: str, *args, backend: str | None = None, **kwargs) -> PreparedOp:
    """Validate ``op_name``'s arguments and choose its implementation once (raises like the op)."""
    if op_name not in OPS:
        raise InputError(f"unknown op {op_name!r}; ops are {', '.join(OPS)}")
    call = OPS[op_name].validate(*args, **kwargs)
    decision = decide(call, backend)
    if decision.selected is None:
        from .errors import UnsupportedError
        raise UnsupportedError(decision.error)
    return PreparedOp(op_name, decision, call.kwargs, call.device)
