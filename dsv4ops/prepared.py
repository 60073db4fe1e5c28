"""Prepared calls: validate and choose once, then run with no per-call Python checks.

    decode = dsv4ops.prepare("sparse_mla_decode", q, swa, idx, lens, layout="fp8_ds_mla", ...)
    out, lse = decode(q=q2, indices=idx2, topk_lens=lens2)        # checked
    out, lse = decode.run(q=q2, indices=idx2, topk_lens=lens2)    # unchecked

An engine binds one per layer and call site at start-up (or before CUDA-graph capture). Arguments
not given keep the prepared values. ``__call__`` verifies that the arguments have the structure
(dtypes, devices, shapes, strides, scalars: the dispatch fingerprint) that was validated and raises
``InputError`` otherwise; ``run`` trusts the caller and costs what calling the kernel directly costs.
"""
from __future__ import annotations

from .device_guard import run_on
from .errors import InputError, UnsupportedError
from .ops import OPS
from .selection import Decision, decide, fingerprint


class PreparedOp:
    def __init__(self, op, decision: Decision, call):
        self.op = op.name
        self.decision = decision
        self.backend = decision.backend
        self.device = call.device
        self._fn = decision.selected.fn
        self._args = call.args
        self._fingerprint = fingerprint(call.args)

    def run(self, **changes):
        """Call the chosen implementation; the arguments must match the prepared structure."""
        return run_on(self.device, self._fn, self._args._replace(**changes))

    def __call__(self, **changes):
        try:
            args = self._args._replace(**changes)
        except ValueError as exc:
            raise InputError(f"{self.op}: {exc}") from None
        if fingerprint(args) != self._fingerprint:
            raise InputError(f"{self.op}: arguments differ in dtype, device, shape, strides or a scalar from "
                             f"the ones this call was prepared with; prepare a new call for them")
        return run_on(self.device, self._fn, args)

    def __repr__(self) -> str:
        return f"PreparedOp({self.op} -> {self.backend})"


def prepare(op_name: str, *args, backend: str | None = None, **kwargs) -> PreparedOp:
    """Validate ``op_name``'s arguments and choose its implementation once (raises like the op)."""
    if op_name not in OPS:
        raise InputError(f"unknown op {op_name!r}; ops are {', '.join(OPS)}")
    op = OPS[op_name]
    call = op.validate_call(*args, **kwargs)
    decision = decide(call, backend)
    if decision.selected is None:
        raise UnsupportedError(decision.error)
    return PreparedOp(op, decision, call)
