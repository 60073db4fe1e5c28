"""``DSV4OPS_VERIFY``: re-run a sampled fraction of calls on the reference and compare (docs/verify.md).

``settings.parse_verify(value)`` reads the setting; ``wrap(op, impl, rate, action)`` returns ``impl`` with
every ``round(1 / rate)``-th call (the first included) verified: the tensors the op may write are
copied before ``impl`` runs, the reference runs on the copies, and the op's comparison rule (its
spec's ``conformance.compare``) judges ``impl``'s result. A mismatch saves the call's inputs with
``torch.save`` and is logged (logger ``dsv4ops.verify``) or raised as ``VerificationError``, by
setting; ``replay(path)`` runs a saved call again. Calls under CUDA-graph capture or
``torch.compile`` tracing are never verified. Off, nothing is wrapped: it costs nothing.
"""
from __future__ import annotations

import itertools
import logging
import os
import time
from typing import Any, Callable

import torch

from . import registry
from .errors import ConfigError, VerificationError
from .formats import Layout
from .settings import VERIFY_ACTIONS, VerifyConfig
from .tensors import clone_kwargs

ENV = "DSV4OPS_VERIFY"
MAX_DUMPS = 3             # mismatching calls saved per (op, implementation): a dump holds every input
log = logging.getLogger("dsv4ops.verify")


def wrap(op, impl: Callable[[Any], Any], rate: float, action: str = "log", *, backend: str | None = None,
         dump_dir: str = VerifyConfig.dump_dir) -> Callable[[Any], Any]:
    """``impl`` (an implementation of ``op``, an ``Op`` or its name, taking the typed args) with
    every ``round(1 / rate)``-th call, the first included, verified against the reference.
    ``impl`` itself when ``rate`` is 0, when ``impl`` is the reference, or when the op has no rule.
    Wrapping the same implementation again returns the same wrapper (the sampling continues)."""
    op = registry.get_op(op) if isinstance(op, str) else op
    key = (op.name, impl, rate, action, backend, dump_dir)
    if key not in _wrappers:                     # one sampling counter per (op, implementation, setting)
        _wrappers[key] = _wrap(op, impl, rate, action, backend, dump_dir)
    return _wrappers[key]


_wrappers: dict[tuple, Callable[[Any], Any]] = {}


def _wrap(op, impl, rate, action, backend, dump_dir):
    if action not in VERIFY_ACTIONS:
        raise ConfigError(f"{ENV}: action {action!r} must be one of {', '.join(VERIFY_ACTIONS)}")
    reference = registry.get_backend("reference").implementations[op.name][0].fn
    if rate <= 0 or impl is reference:
        return impl
    period = max(1, round(1 / rate))
    counter, dumps = itertools.count(), itertools.count()
    written = [a.name for a in op.spec.args if a.is_tensor and (a.mutated or op.spec.out_variant_only)]
    label = backend or getattr(impl, "__module__", None) or repr(impl)

    def verified(args):
        if next(counter) % period or _tracing(args):
            return impl(args)
        return _verify(op, impl, reference, args, written, label, action,
                       dump_dir if next(dumps) < MAX_DUMPS else None)

    verified.__wrapped__ = impl
    return verified


def _tracing(args) -> bool:
    """CUDA-graph capture, torch.compile tracing or shape-only tensors: nothing to compare."""
    if torch.compiler.is_compiling():
        return True
    if torch.cuda.is_initialized() and torch.cuda.is_current_stream_capturing():
        return True
    return any(isinstance(v, torch.Tensor) and v.device.type == "meta" for v in args)


def _copy(args, names):
    return args._replace(**{n: getattr(args, n).clone() for n in names if getattr(args, n) is not None})


def _verify(op, impl, reference, args, written, label, action, dump_dir: str | None):
    """One verified call; a mismatch is saved to ``dump_dir`` (None: not saved)."""
    before = _copy(args, written)                 # the written tensors as the caller passed them
    result = impl(args)
    try:
        ref_args = _copy(before, written)
        ref_result = reference(ref_args)
        verdict = op.spec.conformance.compare({}, ref_args._asdict(), ref_result, args._asdict(), result)
    except Exception as exc:                      # verifying must never break a call that succeeded
        log.warning("%s: could not verify %s on %s: %s: %s", ENV, op.name, label, type(exc).__name__, exc)
        return result
    if not verdict.ok:
        inputs = before._replace(**{n: getattr(args, n) for n in args._fields if n not in written})
        message = _report(op, label, inputs, verdict, _dump(op, label, inputs, verdict, dump_dir))
        if action == "raise":
            raise VerificationError(message)
        log.error("%s", message)
    return result


def _describe(value) -> str:
    if isinstance(value, torch.Tensor):
        dtype = str(value.dtype).replace("torch.", "")
        return f"{dtype}{list(value.shape)} stride {tuple(value.stride())} on {value.device}"
    return repr(value)


def _report(op, label, inputs, verdict, saved: str) -> str:
    args = "; ".join(f"{n}={_describe(v)}" for n, v in zip(inputs._fields, inputs))
    worst = f" (worst error {verdict.worst:.3g} x the tolerance)" if verdict.worst else ""
    return f"{ENV}: {op.name} on {label} differs from the reference: {verdict.message}{worst}. Inputs: {args}. {saved}"


def _dump(op, label, inputs, verdict, dump_dir: str | None) -> str:
    """Save the call's inputs (on the CPU) for ``replay``; the sentence that says where."""
    if dump_dir is None:
        return f"Inputs not saved: {MAX_DUMPS} calls of {op.name} on {label} were saved already."
    kwargs = {n: v.detach().cpu() if isinstance(v, torch.Tensor) else v.name if isinstance(v, Layout) else v
              for n, v in zip(inputs._fields, inputs)}
    path = os.path.join(dump_dir, f"{op.name}-{label.rpartition('.')[2]}-{time.strftime('%Y%m%dT%H%M%S')}-"
                                  f"{os.getpid()}-{time.monotonic_ns()}.pt")
    device = next((str(v.device) for v in inputs if isinstance(v, torch.Tensor)), "cpu")
    try:
        os.makedirs(dump_dir, exist_ok=True)
        torch.save(dict(op=op.name, backend=label, device=device, message=verdict.message, kwargs=kwargs), path)
    except Exception as exc:
        return f"The inputs could not be saved to {dump_dir}: {type(exc).__name__}: {exc}."
    return f"Inputs saved to {path}; rerun: python -c \"import dsv4ops.verify as v; print(v.replay({path!r}))\""


def replay(path: str, backend: str | None = None, device: str | None = None):
    """Run a call saved by a mismatch again: ``backend`` (default: the one recorded, if it is a
    backend name, else the priority choice) against the reference, on ``device`` (default: the
    recorded one). Returns the rule's Verdict."""
    saved = torch.load(path, weights_only=True)
    device = device or saved["device"]
    kwargs = {n: v.to(device) if isinstance(v, torch.Tensor) else v for n, v in saved["kwargs"].items()}
    if backend is None and saved["backend"] in registry.backend_names():
        backend = saved["backend"]
    ref_kwargs, got_kwargs = clone_kwargs(kwargs), clone_kwargs(kwargs)
    op = registry.get_op(saved["op"])
    ref = op.function(**ref_kwargs, backend="reference")
    got = op.function(**got_kwargs, backend=backend)
    return op.spec.conformance.compare({}, ref_kwargs, ref, got_kwargs, got)
