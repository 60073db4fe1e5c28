"""Prepared calls: validate and choose once, then run with no per-call Python checks.

    decode = dsv4ops.prepare("sparse_mla_decode", q, swa, idx, lens, layout="fp8_ds_mla", ...)
    out, lse = decode(q=q2, indices=idx2, topk_lens=lens2)        # checked
    out, lse = decode.run(q=q2, indices=idx2, topk_lens=lens2)    # unchecked

An engine binds one per layer and call site at start-up (or before CUDA-graph capture). Arguments
not given keep the prepared values. ``__call__`` verifies that the arguments have the structure
(dtypes, devices, shapes, strides, scalars and their types: the op's structure key) that was
validated and raises ``InputError`` otherwise; on CPU tensors, and with ``DSV4OPS_DEBUG=1``, it
validates the values too, like a plain call. ``run`` trusts the caller and costs what calling the
kernel directly costs.
"""
from __future__ import annotations

from .errors import InputError, UnsupportedError
from .ops import OPS
from .selection import Decision, decide, runner
from .settings import debug_enabled


class PreparedOp:
    def __init__(self, op, decision: Decision, call, backend: str | None):
        self._op = op
        self.op = op.name
        self.decision = decision
        self.backend = decision.backend
        self.device = call.device
        self._run = runner(decision, call.device, backend)
        self._args = call.args
        self._structure = op.structure(call.args)

    def run(self, **changes):
        """Call the chosen implementation; the arguments must match the prepared structure."""
        return self._run(self._args._replace(**changes))

    def __call__(self, **changes):
        try:
            args = self._args._replace(**changes)
        except ValueError as exc:
            raise InputError(f"{self.op}: {exc}") from None
        if self._op.structure(args) != self._structure:
            raise InputError(f"{self.op}: arguments differ in dtype, device, shape, strides or a scalar from "
                             f"the ones this call was prepared with; prepare a new call for them")
        if self.device.type == "cpu" or debug_enabled():
            args = self._op.validate(args).args          # value checks (index ranges, lengths)
        return self._run(args)

    def __repr__(self) -> str:
        return f"PreparedOp({self.op} -> {self.backend})"


def prepare(op_name: str, *args, backend: str | None = None, capturable: bool | None = None, **kwargs) -> PreparedOp:
    """Validate ``op_name``'s arguments and choose its implementation once (raises like the op).

    ``capturable=True``: choose among the implementations a CUDA graph can capture (an engine that
    prepares before it captures); None: only while the inputs' device is capturing."""
    if op_name not in OPS:
        raise InputError(f"unknown op {op_name!r}; ops are {', '.join(OPS)}")
    op = OPS[op_name]
    call = op.validate_call(*args, **kwargs)
    if call.device.type == "meta":
        raise InputError(f"{op_name}: meta tensors have no backend to prepare; call dsv4ops.{op_name} for "
                         f"shape-only outputs")
    decision = decide(call, backend, capturable=capturable)
    if decision.selected is None:
        raise UnsupportedError(decision.error)
    return PreparedOp(op, decision, call, backend)
