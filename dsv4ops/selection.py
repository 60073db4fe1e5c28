"""Choosing and running an implementation: ``backend=`` argument, then ``DSV4OPS_BACKEND``, then priority.

One fingerprint of a call serves every cache: per tensor its dtype, device, shape and strides, every
other argument as it is (``fingerprint``). A call whose fingerprint was seen before goes straight to
the implementation chosen then (``dispatch``); validation runs again only where value checks apply
(CPU tensors, or ``DSV4OPS_DEBUG=1``). Capability checks see the call's ``DispatchKey``, a coarser
view, so every decision cached per fingerprint is the one ``decide`` would make again.
"""
from __future__ import annotations

import functools
import os
import threading
from dataclasses import dataclass
from typing import Any, Callable

import torch

from . import priorities, registry
from .device_guard import run_on
from .errors import ConfigError, UnsupportedError
from .platform import Platform, current_simulation, platform
from .settings import debug_enabled

ENV = "DSV4OPS_BACKEND"
PLATFORM_ENV = "DSV4OPS_PLATFORM"
_MAX_CACHED = 4096


def fingerprint(args) -> tuple:
    """Hashable structure of a call's arguments: tensor dtype, device, shape, strides; other values."""
    return tuple((v.dtype, v.device, v.shape, v.stride()) if isinstance(v, torch.Tensor) else v for v in args)


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
    entries = [e.strip() for e in value.split(",")]
    if len(entries) == 1 and "=" not in entries[0]:
        entries = [f"*={entries[0]}"]
    parsed: dict[str, EnvChoice] = {}
    for entry in entries:
        op, eq, names = entry.partition("=")
        op, names = op.strip(), names.strip()
        if not eq or not op or not names:
            raise ConfigError(f"{ENV}: bad entry {entry!r}; expected 'backend' or 'op=backend[|backend...]'")
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
    table = parse_backend_env(os.environ.get(ENV, ""))
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
    source: str                          # "backend= argument", "DSV4OPS_BACKEND", or "priority"
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


def _ordered(call, plat: Platform) -> list[tuple[int, registry.Implementation]]:
    """Implementations by effective priority: the table's, with measured preferences applied."""
    impls = registry.implementations(call.op)
    prefs = priorities.preferred(call.op, plat.key, call.key)
    base = {i.backend.name: max(j.priority for j in impls if j.backend.name == i.backend.name) for i in impls}
    ranked = [(base[prefs[i.backend.name]] + 1 if prefs.get(i.backend.name) in base else i.priority, i)
              for i in impls]
    return sorted(ranked, key=lambda r: -r[0])


def decide(call, backend: str | None = None, *, evaluate_all: bool = False) -> Decision:
    """Pick the implementation for ``call`` without raising (the error, if any, is in the Decision).

    Only the wanted backends are evaluated, in order, until one accepts: a forced backend is checked
    alone, and a backend's probe runs only when it is a candidate. ``evaluate_all`` (``explain``)
    also asks the remaining wanted ones, to report why each would or would not serve."""
    plat = platform(call.device)
    ranked = _ordered(call, plat)
    if backend is not None:
        source, wanted, strict = "backend= argument", (backend,), True
    else:
        choice = env_choice(call.op)
        if choice is not None:
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
                reasons[id(impl)] = impl.decline_reason(plat, call.key)
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
    return Decision(call.op, plat, source, selected, candidates, error)


# ---------------------------------------------------------------------------------------------
# The hot path

@dataclass(frozen=True)
class _Chosen:
    fn: Callable
    device: torch.device
    normalized: dict            # argument values validation normalized (a layout name -> Layout)
    value_checked: bool         # CPU tensors: validation (value checks) runs on every call


_cache: dict[tuple, _Chosen] = {}
_cache_lock = threading.Lock()


def clear_cache() -> None:
    with _cache_lock:
        _cache.clear()


registry.on_change(clear_cache)


def choose(call, backend: str | None) -> registry.Implementation:
    """The implementation that runs ``call``; raises UnsupportedError when none can."""
    decision = decide(call, backend)
    if decision.selected is None:
        raise UnsupportedError(decision.error)
    return decision.selected


def dispatch(op, args, backend: str | None) -> Any:
    """Validate, choose and run one call of ``op`` (typed ``args``), on the device of its tensors."""
    environ = os.environ
    key = (op, backend, environ.get(ENV, ""), environ.get(PLATFORM_ENV, ""), current_simulation(),
           fingerprint(args))
    chosen = _cache.get(key)
    if chosen is None or chosen.value_checked or debug_enabled():
        call = op.validate(args)
        if chosen is None:
            impl = choose(call, backend)
            normalized = {name: new for name, old, new in zip(args._fields, args, call.args)
                          if new is not old and not isinstance(new, torch.Tensor)}
            chosen = _Chosen(impl.fn, call.device, normalized, call.device.type == "cpu")
            with _cache_lock:
                if len(_cache) >= _MAX_CACHED:
                    _cache.clear()
                _cache[key] = chosen
        args = call.args
    elif chosen.normalized:
        args = args._replace(**chosen.normalized)
    return run_on(chosen.device, chosen.fn, args)
