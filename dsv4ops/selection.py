"""Choosing and running an implementation: ``backend=`` argument, then ``DSV4OPS_BACKEND``, then priority.

One structure key of a call (``Op.structure``, generated per op in opspec.py) serves every cache:
per tensor its dtype, device, shape and strides, every other argument with its type. A call whose
key was seen before goes straight to the implementation chosen then; validation runs again only
where value checks apply (CPU tensors, or ``DSV4OPS_DEBUG=1``). Before computing the key, the
public function tries the compiled guards (``tensor_guard``) of the op's few most recently used
structures: the same check at a fraction of the cost. Capability checks see the call's
``DispatchKey``, a coarser view, so every decision cached per key is the one ``decide`` would make.
"""
from __future__ import annotations

import functools
import threading
from dataclasses import dataclass
from typing import Any, Callable

import torch

from . import priorities, registry, settings, tensor_guard, tuning_table, verify
from .device_guard import bound_to
from .errors import ConfigError, UnsupportedError
from .platform import Platform, platform

ENV = "DSV4OPS_BACKEND"
_MAX_CACHED = 4096


# ---------------------------------------------------------------------------------------------
# DSV4OPS_BACKEND

@dataclass(frozen=True)
class EnvChoice:
    backends: tuple[str, ...]

    @property
    def strict(self) -> bool:
        """A single name is a forced choice; a ``|`` list is an ordered fallback list."""
        return len(self.backends) == 1


@functools.lru_cache(maxsize=64)
def parse_backend_env(value: str) -> dict[str, EnvChoice]:
    """``"triton"`` or ``"op=a|b,*=c"`` -> {op or "*": EnvChoice}. Raises ConfigError on bad syntax."""
    op_names = registry.op_names()
    value = value.strip()
    if not value:
        return {}
    entries = [e.strip() for e in value.split(",") if e.strip()]       # a trailing comma is harmless
    if len(entries) == 1 and "=" not in entries[0]:
        entries = [f"*={entries[0]}"]
    parsed: dict[str, EnvChoice] = {}
    for entry in entries:
        op, eq, names = entry.partition("=")
        op, names = op.strip(), names.strip()
        if not eq or not op or not names:
            raise ConfigError(f"{ENV}={value!r}: bad entry {entry!r}; expected one 'backend', or entries "
                              f"'op=backend[|backend...]' separated by ',' ('*' for every op)")
        if op != "*" and op not in op_names:
            raise ConfigError(f"{ENV}: bad entry {entry!r}: unknown op {op!r}; ops are {', '.join(op_names)} or '*'")
        if op in parsed:
            raise ConfigError(f"{ENV}: op {op!r} is given twice")
        choice = tuple(n.strip() for n in names.split("|"))
        known = registry.backend_names()
        for name in choice:
            if name not in known:
                raise ConfigError(f"{ENV}: bad entry {entry!r}: unknown backend {name!r}; backends are {', '.join(known)}")
        parsed[op] = EnvChoice(choice)
    return parsed


def env_choice(op: str) -> EnvChoice | None:
    table = parse_backend_env(settings.current().backend)
    return table.get(op) or table.get("*")


# ---------------------------------------------------------------------------------------------
# Decisions

@dataclass
class Candidate:
    backend: str
    implementation: str
    priority: int
    status: str          # "selected", "available ...", "not evaluated ...", or the reason it declined


@dataclass
class Decision:
    """What ``explain`` returns: the chosen implementation and why every other one was not."""

    op: str
    platform: Platform
    source: str            # "backend= argument", "DSV4OPS_BACKEND", "priority" or "tuning table <path>"
    selected: registry.Implementation | None
    candidates: list[Candidate]
    error: str | None = None

    @property
    def backend(self) -> str | None:
        return self.selected.backend.name if self.selected else None

    def __str__(self) -> str:
        from ._table import render_table

        head = f"{self.op} on {self.platform}: "
        head += f"{self.backend} (by {self.source})" if self.selected else f"no implementation ({self.error})"
        rows = [(c.implementation, str(c.priority), c.status) for c in self.candidates]
        return head + "\n" + render_table(("implementation", "priority", "status"), rows)


def _ordered(call, plat: Platform, measured: str | None) -> list[tuple[int, registry.Implementation]]:
    """Implementations by effective priority: the table's, with measured preferences applied, and
    the tuning table's ``measured`` choice (if any) first."""
    impls = registry.implementations(call.op)
    prefs = priorities.preferred(call.op, plat, call.key)
    base = {i.backend.name: max(j.priority for j in impls if j.backend.name == i.backend.name) for i in impls}
    top = max(base.values(), default=0) + 1
    ranked = [(top if i.backend.name == measured else
               base[prefs[i.backend.name]] + 1 if prefs.get(i.backend.name) in base else i.priority, i)
              for i in impls]
    return sorted(ranked, key=lambda r: -r[0])


def capturing(device) -> bool:
    """Whether the current stream of ``device`` is capturing a CUDA graph."""
    if device.type != "cuda" or not torch.cuda.is_initialized():
        return False
    with torch.cuda.device(device):
        return torch.cuda.is_current_stream_capturing()


def decide(call, backend: str | None = None, *, evaluate_all: bool = False, capturable: bool | None = None) -> Decision:
    """Pick the implementation for ``call`` without raising (the error, if any, is in the Decision).

    Only the wanted backends are evaluated, in order, until one accepts: a forced backend is checked
    alone, and a backend's probe runs only when it is a candidate. ``evaluate_all`` (``explain``)
    also asks the remaining wanted ones, to report why each would or would not serve.
    ``capturable``: choose only among implementations a CUDA graph can capture (None: only while
    the inputs' device is capturing)."""
    plat = platform(call.device)
    if capturable is None:
        capturable = capturing(call.device)
    choice = env_choice(call.op)           # a malformed DSV4OPS_BACKEND is an error even when overridden
    measured = tuning_table.measured_choice(plat, call.op, call.key) if backend is None and choice is None else None
    ranked = _ordered(call, plat, measured[0] if measured else None)
    if backend is not None:
        source, wanted, strict = "backend= argument", (backend,), True
    elif choice is not None:
        source, wanted, strict = ENV, choice.backends, choice.strict
    else:
        source, wanted, strict = "priority", tuple(dict.fromkeys(i.backend.name for _, i in ranked)), False

    reasons: dict[int, str | None] = {}
    selected = None
    for name in wanted:
        for _, impl in ranked:
            if impl.backend.name == name:
                if selected is not None and not evaluate_all:
                    break
                reasons[id(impl)] = _capture_reason(impl) if capturable else None
                reasons[id(impl)] = reasons[id(impl)] or impl.decline_reason(plat, call.key)
                if reasons[id(impl)] is None and selected is None:
                    selected = impl
        if selected is not None and not evaluate_all:
            break

    error = None
    if selected is None:
        why = []
        for name in wanted:
            declined = [f"{i.name}: {reasons[id(i)]}" for _, i in ranked if i.backend.name == name]
            if declined:
                why += declined
            else:
                why.append(f"{name}: " + ("does not implement this op" if registry.get_backend(name)
                                          else "no such backend"))
        verb = "forced by" if strict else "chosen from"
        error = f"{call.op}: no implementation can serve these inputs ({verb} {source}): " + "; ".join(why)

    candidates = []
    for prio, impl in ranked:
        if impl is selected:
            status = "selected"
        elif reasons.get(id(impl)) is not None:
            status = reasons[id(impl)]
        elif impl.backend.name not in wanted:
            status = f"not evaluated, excluded by {source}"
        elif id(impl) not in reasons:
            status = "not evaluated, " + ("lower priority" if source == "priority" else "later in the list")
        else:
            status = "available, " + ("lower priority" if source == "priority" else "later in the list")
        candidates.append(Candidate(impl.backend.name, impl.name, prio, status))
    if measured and selected is not None and selected.backend.name == measured[0]:
        source = f"tuning table {measured[1]}"
    return Decision(call.op, plat, source, selected, candidates, error)


def _capture_reason(impl: registry.Implementation) -> str | None:
    if impl.cannot_capture is None:
        return None
    return f"a CUDA graph cannot capture it ({impl.cannot_capture})"


# ---------------------------------------------------------------------------------------------
# The hot path
#
# Each op's public function (generated in opspec.py) looks its call's structure key up in the op's
# fast table: per tensor dtype, device, shape and strides, every other argument with its type (so
# ``block_size=16.0`` is not taken for the validated ``16``), the ``backend=`` argument and the
# thread's simulated platform. A hit calls the chosen implementation at once. A miss comes here:
# validation, then the decision (cached per key as well), then, where value checks need not run on
# every call (accelerator tensors without DSV4OPS_DEBUG), the runner goes into the fast table.
# Settings and registry changes empty every table.

RECENT = 4                  # structures per op whose compiled guard a call tries before the key

_fast_tables: dict[str, dict] = {}
_recent: dict[str, list] = {}
_decisions: dict[tuple, tuple] = {}
_lock = threading.RLock()


def fast_table(op_name: str) -> dict:
    """One op's structure key -> ``(guard, scalars, runner)`` table (the generated public function
    holds it); only structures whose calls may skip validation are in it."""
    return _fast_tables.setdefault(op_name, {})


def recent_structures(op_name: str) -> list:
    """The op's most recently used fast-table entries, newest first, at most ``RECENT`` (the
    generated public function tries their guards before it computes the structure key)."""
    return _recent.setdefault(op_name, [])


def clear_cache() -> None:
    with _lock:
        for table in (*_fast_tables.values(), *_recent.values()):
            table.clear()
        _decisions.clear()


registry.on_change(clear_cache)
settings.on_reload(clear_cache)


def choose(call, backend: str | None, capturable: bool | None = None) -> Decision:
    """The decision for ``call``; raises UnsupportedError when no implementation can serve it."""
    decision = decide(call, backend, capturable=capturable)
    if decision.selected is None:
        raise UnsupportedError(decision.error)
    return decision


def runner(decision: Decision, device, backend: str | None = None) -> Callable[[Any], Any]:
    """The decision's implementation bound to its platform and the inputs' device (and sampled by
    ``DSV4OPS_VERIFY`` when it is on): what a fast-table hit calls with the typed args. One that a
    CUDA graph cannot capture hands calls made while the device is capturing to the implementation
    chosen among the capturable ones (``backend``: the call's ``backend=``, which stays forced)."""
    impl = decision.selected
    check = settings.current().verify
    fn = impl.bound(decision.platform)
    if check.enabled:
        fn = verify.wrap(impl.op, fn, check.rate, check.action, backend=impl.backend.name, dump_dir=check.dump_dir)
    if impl.cannot_capture is not None and device.type == "cuda":
        fn = _outside_capture(registry.get_op(impl.op), fn, device, backend)
    return bound_to(device, fn)


def _outside_capture(op, fn: Callable[[Any], Any], device, backend: str | None) -> Callable[[Any], Any]:
    """``fn``, except while the (current) device's stream is capturing: then the capturable choice."""
    under_capture: list[Callable[[Any], Any]] = []

    def run(args):
        if not capturing(device):
            return fn(args)
        if not under_capture:
            under_capture.append(runner(choose(op.validate(args), backend, capturable=True), device, backend))
        return under_capture[0](args)

    return run


def skips_validation(device) -> bool:
    """Whether calls on ``device`` may skip validation once their structure was validated: value
    checks (index ranges, lengths) run on CPU tensors always, on accelerators under DSV4OPS_DEBUG."""
    return device.type != "cpu" and not settings.current().debug


def dispatch(op, args, backend: str | None, key: tuple | None = None) -> Any:
    """Validate, choose and run one call of ``op`` (typed ``args``); ``key`` is the call's structure
    key (None when it has none: an unhashable or malformed argument, which validation reports)."""
    call = op.validate(args)
    if call.device.type == "meta":               # shape-only: the outputs' shapes and dtypes, no backend
        return op.spec.fake(call.args)
    cached = _decisions.get((op.name, key)) if key is not None else None
    if cached is None:
        run = runner(choose(call, backend, capturable=False), call.device, backend)   # runner() handles capture
        if key is not None:
            fast = skips_validation(call.device)
            guard = tensor_guard.guard_for(op.guarded(args)) if fast else None
            with _lock:
                if len(_decisions) >= _MAX_CACHED:
                    clear_cache()
                _decisions[(op.name, key)] = (run,)
                if fast:
                    entry = fast_table(op.name)[key] = (guard, key[0], run)
                    if guard is not None:
                        recent = recent_structures(op.name)
                        recent.insert(0, entry)
                        del recent[RECENT:]
    else:
        run, = cached
    return run(call.args)
