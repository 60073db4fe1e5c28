"""Prepared calls: validate and choose once, then run with no per-call Python checks.

    decode = dsv4ops.prepare("sparse_mla_decode", q, swa, idx, lens, layout="fp8_ds_mla", ...)
    out, lse = decode(q=q2, indices=idx2, topk_lens=lens2)        # checked
    out, lse = decode.run(q=q2, indices=idx2, topk_lens=lens2)    # unchecked

A prepared call is bound to the exact structure it was prepared with: every tensor's dtype,
device, shape and strides, and the scalars (the op's structure key). An engine binds one per
layer, call site and captured batch size at start-up (before CUDA-graph capture), e.g.
``{bs: dsv4ops.prepare(op, **inputs(bs)) for bs in capture_sizes}``; another shape needs another
prepared call. Arguments are given by keyword; those not given keep the prepared values.

``__call__`` verifies that the arguments have the prepared structure and raises ``InputError``
naming the first argument that differs and how; on CPU tensors, and with ``DSV4OPS_DEBUG=1``, it
validates the values too, like a plain call. ``run`` is unchecked: it trusts the caller (a wrong
dtype or shape there is undefined behaviour, not an error) and costs what calling the kernel
directly costs.
"""
from __future__ import annotations

import torch

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

    def run(self, *positional, **changes):
        """Call the chosen implementation, unchecked: the keyword arguments must have the prepared
        structure (nothing verifies it)."""
        if positional:
            raise self._positional_error()
        return self._run(self._args._replace(**changes))

    def __call__(self, *positional, **changes):
        if positional:
            raise self._positional_error()
        try:
            args = self._args._replace(**changes)
        except ValueError as exc:
            raise InputError(f"{self.op}: {exc}") from None
        if self._op.structure(args) != self._structure:
            raise InputError(f"{self.op}: {_difference(self._args, args)}; a prepared call is bound to "
                             f"its shapes: prepare a new call for them (one per captured batch size)")
        if self.device.type == "cpu" or debug_enabled():
            args = self._op.validate(args).args          # value checks (index ranges, lengths)
        return self._run(args)

    def _positional_error(self) -> InputError:
        return InputError(f"{self.op}: a prepared call takes keyword arguments only (e.g. "
                          f"{self._args._fields[0]}=...); the arguments not given keep the prepared values")

    def __repr__(self) -> str:
        return f"PreparedOp({self.op} -> {self.backend})"


def _describe(value) -> str:
    if isinstance(value, torch.Tensor):
        return (f"{str(value.dtype).replace('torch.', '')} {list(value.shape)} strides {value.stride()} on "
                f"{value.device}")
    return f"{value!r} ({type(value).__name__})"


def _difference(prepared, given) -> str:
    """The first argument of ``given`` whose structure differs from ``prepared``'s, and how
    (tensors first, then scalars)."""
    pairs = [(name, getattr(prepared, name), getattr(given, name)) for name in prepared._fields]
    ordered = sorted(pairs, key=lambda p: not isinstance(p[1], torch.Tensor) and not isinstance(p[2], torch.Tensor))
    for name, old, new in ordered:
        if old is not new and _describe(old) != _describe(new):
            return f"argument '{name}' is {_describe(new)}; the call was prepared with {_describe(old)}"
    return "the arguments differ from the prepared ones in a scalar's type"


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
