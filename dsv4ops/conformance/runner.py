"""Run one case on one backend against the reference and judge it."""
from __future__ import annotations

import time
import traceback
from dataclasses import dataclass
from typing import Callable

import torch

from .. import registry
from ..selection import decide
from ..tensors import clone_kwargs
from ..tolerance import Verdict
from .cases import Case
from .repeat import check_repeatable

POISON_FLOAT = float("nan")
POISON_INT = -7


@dataclass
class Result:
    case: Case
    backend: str
    status: str                    # "pass" | "fail" | "skip" | "error"
    worst: float = 0.0
    message: str = ""
    seconds: float = 0.0
    seed: int = 0

    def reproducer(self) -> str:
        return (f"dsv4ops check --ops {self.case.op} --backends {self.backend} --tier {self.case.tier} "
                f"--case '{self.case.id}' --seed {self.seed}")


def poison(t: torch.Tensor) -> None:
    """Fill an output buffer so that any element the backend does not write fails the comparison."""
    if t.dtype.is_floating_point and t.dtype not in (torch.float8_e4m3fn, torch.float8_e4m3fnuz):
        t.fill_(POISON_FLOAT)
    elif t.dtype in (torch.float8_e4m3fn, torch.float8_e4m3fnuz):
        t.view(torch.uint8).fill_(0x7F)          # NaN in e4m3fn
    else:
        t.fill_(POISON_INT)


def run_case(case: Case, backend: str, device, seed: int = 0, repeat: int = 1, inputs: dict | None = None,
             reference: Callable[[], tuple] | None = None) -> Result:
    """``case`` on ``backend`` against the reference (``repeat`` > 1: also ``repeat.check_repeatable``).
    ``inputs``: the case's arguments already built from ``seed`` (never written: each call gets
    copies); ``reference``: returns ``(kwargs, result)`` of the reference's call on copies of them
    (run_matrix shares both among the backends of a case)."""
    start = time.perf_counter()
    try:
        kwargs = case.build(device, seed) if inputs is None else inputs
    except Exception as exc:
        return Result(case, backend, "error", message=f"building inputs failed: {exc}", seed=seed)
    op = registry.get_op(case.op)
    decision = decide(op.validate_call(**kwargs), backend)
    if decision.selected is None:
        reason = next((c.status for c in decision.candidates if c.backend == backend), "not registered for this op")
        return Result(case, backend, "skip", message=reason, seed=seed)

    ref_kwargs, ref_result = (reference or (lambda: reference_call(case.op, kwargs)))()
    got_kwargs = clone_kwargs(kwargs)
    if got_kwargs.get("out") is not None:
        poison(got_kwargs["out"])
    try:
        got_result = op.function(**got_kwargs, backend=backend)
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        verdict: Verdict = op.spec.conformance.compare(case.kwargs, ref_kwargs, ref_result, got_kwargs, got_result)
        if verdict.ok:
            verdict = _check_contiguous(got_result, got_kwargs.get("out"), verdict)
        if verdict.ok and got_kwargs.get("out") is not None:
            verdict = _check_out_returned(got_kwargs["out"], got_result, verdict)
        if verdict.ok and repeat > 1:
            verdict = check_repeatable(op, backend, kwargs, got_kwargs, got_result, repeat, poison) or verdict
    except Exception as exc:
        tb = traceback.format_exc(limit=3).strip().splitlines()[-1]
        return Result(case, backend, "error", message=f"{type(exc).__name__}: {exc} ({tb})",
                      seconds=time.perf_counter() - start, seed=seed)
    return Result(case, backend, "pass" if verdict.ok else "fail", verdict.worst, verdict.message,
                  time.perf_counter() - start, seed)


def _check_contiguous(result, out, verdict: Verdict) -> Verdict:
    """Every returned tensor is contiguous (engines and torch.ops fake implementations rely on it),
    except the caller's ``out`` buffer, returned as given."""
    tensors = [t for t in (result if isinstance(result, tuple) else (result,)) if t is not out]
    if any(t is not None and not t.is_contiguous() for t in tensors):
        return Verdict(False, verdict.worst, f"returned a non-contiguous tensor (strides "
                       f"{[t.stride() for t in tensors if t is not None]})")
    return verdict


def _check_out_returned(out: torch.Tensor, result, verdict: Verdict) -> Verdict:
    first = result[0] if isinstance(result, tuple) else result
    if first.data_ptr() != out.data_ptr():
        return Verdict(False, verdict.worst, "out= was given but the result is not that buffer")
    return verdict


def reference_call(op: str, inputs: dict) -> tuple[dict, object]:
    """The reference's call on copies of ``inputs``: (the copies, as it left them; its result)."""
    kwargs = clone_kwargs(inputs)
    return kwargs, run_reference(op, kwargs)


def run_reference(op: str, kwargs: dict):
    """The reference's result for keyword arguments of the public function (validated first)."""
    return registry.get_op(op).function(**kwargs, backend="reference")
