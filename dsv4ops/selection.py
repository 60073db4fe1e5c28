"""Choosing an implementation: ``backend=`` argument, then ``DSV4OPS_BACKEND``, then priority.

Decisions are cached per (op, forced backend, env setting, platform, input signature). The
signature holds what capability checks may look at: per tensor its dtype, device and shape without
the leading (token / batch) dimension, plus non-float scalar arguments and which optionals are
given; so the steady state of a decode loop whose token count varies hits the cache.
"""
from __future__ import annotations

import functools
import os
import threading
from dataclasses import dataclass, field
from typing import Any

import torch

from . import registry
from .device_guard import run_on
from .errors import ConfigError, UnsupportedError
from .platform import Platform, current_simulation, platform
from .settings import debug_enabled

ENV = "DSV4OPS_BACKEND"
_MAX_CACHED = 4096


@dataclass(frozen=True)
class OpCall:
    """Validated arguments of one op call (``kwargs`` excludes ``backend``)."""

    op: str
    kwargs: dict
    device: torch.device
    signature: tuple = field(default=())

    @property
    def size_class(self) -> int:
        """``bit_length`` of the leading (token / row / batch) size: 0, 1, 2-3, 4-7, ... -> 0, 1, 2, 3.
        Part of the signature, so decisions may depend on it and stay cached per class."""
        return _size_class(self.kwargs)

    def __getattr__(self, name: str) -> Any:
        try:
            return self.__dict__["kwargs"][name]
        except KeyError:
            raise AttributeError(name) from None


def _size_class(kwargs: dict) -> int:
    first = next((v for v in kwargs.values() if isinstance(v, torch.Tensor)), None)
    return int(first.shape[0]).bit_length() if first is not None and first.dim() else 0


def signature_of(kwargs: dict) -> tuple:
    """The part of the arguments that capability checks may depend on (see module doc)."""
    items = [("size_class", _size_class(kwargs))]
    for name, value in kwargs.items():
        if isinstance(value, torch.Tensor):
            items.append((name, value.dtype, value.device.type, tuple(value.shape[1:]), value.dim()))
        elif isinstance(value, float):
            items.append((name, float))
        else:
            items.append((name, value))
    return tuple(items)


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
    from .ops import OP_NAMES

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
        if op != "*" and op not in OP_NAMES:
            raise ConfigError(f"{ENV}: bad entry {entry!r}: unknown op {op!r}; ops are {', '.join(OP_NAMES)} or '*'")
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
    priority: int
    status: str          # "selected", "available", or the reason it was not taken

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
        rows = [(c.backend, str(c.priority), c.status) for c in self.candidates]
        return head + "\n" + render_table(("backend", "priority", "status"), rows)


def decide(call: OpCall, backend: str | None = None) -> Decision:
    """Pick the implementation for ``call`` without raising (the error, if any, is in the Decision)."""
    plat = platform(call.device)
    priorities = {i.backend.name: i.priority_for(plat, call) for i in registry.implementations(call.op)}
    impls = sorted(registry.implementations(call.op), key=lambda i: -priorities[i.backend.name])
    reasons = {i.backend.name: i.decline_reason(plat, call) for i in impls}

    if backend is not None:
        source, wanted, strict = "backend= argument", (backend,), True
    else:
        choice = env_choice(call.op)
        if choice is not None:
            source, wanted, strict = ENV, choice.backends, choice.strict
        else:
            source, wanted, strict = "priority", tuple(i.backend.name for i in impls), False

    by_name = {i.backend.name: i for i in impls}
    selected, error = None, None
    for name in wanted:
        if name in by_name and reasons[name] is None:
            selected = by_name[name]
            break
    if selected is None:
        why = []
        for name in wanted:
            if name not in by_name:
                known = registry.get_backend(name)
                why.append(f"{name}: " + ("does not implement this op" if known else "no such backend"))
            else:
                why.append(f"{name}: {reasons[name]}")
        verb = "forced by" if strict else "chosen from"
        error = f"{call.op}: no implementation can serve these inputs ({verb} {source}): " + "; ".join(why)

    candidates = []
    for impl in impls:
        name = impl.backend.name
        if impl is selected:
            status = "selected"
        elif reasons[name] is not None:
            status = reasons[name]
        elif name not in wanted:
            status = f"available, excluded by {source}"
        else:
            status = "available, lower priority" if source == "priority" else "available, later in the list"
        candidates.append(Candidate(name, priorities[name], status))
    return Decision(call.op, plat, source, selected, candidates, error)


_cache: dict[tuple, registry.Implementation] = {}
_cache_lock = threading.Lock()


def clear_cache() -> None:
    with _cache_lock:
        _cache.clear()
        _fast.clear()


def select(call: OpCall, backend: str | None = None) -> registry.Implementation:
    """The implementation that runs ``call``; raises UnsupportedError when none can."""
    plat = platform(call.device)
    key = (call.op, backend, os.environ.get(ENV, ""), plat, call.signature)
    impl = _cache.get(key)
    if impl is not None:
        return impl
    decision = decide(call, backend)
    if decision.selected is None:
        raise UnsupportedError(decision.error)
    with _cache_lock:
        if len(_cache) >= _MAX_CACHED:
            _cache.clear()
        _cache[key] = decision.selected
    return decision.selected


# Fast path. Structural validation and selection depend only on the arguments' structure (dtype,
# device, shape, strides; scalar values), so for accelerator tensors, where value checks run only
# with DSV4OPS_DEBUG=1, a call whose structure was seen before goes straight to the implementation.
_fast: dict[tuple, object] = {}


def structure(kwargs: dict, cpu_ok: bool = False) -> tuple | None:
    """Hashable structure of the arguments (tensor dtype, device, shape, strides; other values as
    they are); None when a CPU tensor needs its value checks, unless ``cpu_ok``."""
    parts = []
    for value in kwargs.values():
        if isinstance(value, torch.Tensor):
            if value.is_cpu and not cpu_ok:
                return None
            parts.append((value.dtype, value.get_device(), value.shape, value.stride()))
        else:
            parts.append(value)
    return tuple(parts)


def call_op(validate, kwargs: dict, backend: str | None):
    """Validate, select and run, skipping validation and selection for a structure seen before."""
    key = None
    if not debug_enabled():
        shape = structure(kwargs)
        if shape is not None:
            key = (validate, backend, os.environ.get(ENV, ""), os.environ.get("DSV4OPS_PLATFORM", ""),
                   current_simulation(), shape)
            hit = _fast.get(key)
            if hit is not None:
                return run_on(hit[1], hit[0], kwargs)
    call = validate(**kwargs)
    impl = select(call, backend)
    if key is not None:
        with _cache_lock:
            if len(_fast) >= _MAX_CACHED:
                _fast.clear()
            _fast[key] = (impl.fn, call.device)
    return run_on(call.device, impl.fn, call.kwargs)
