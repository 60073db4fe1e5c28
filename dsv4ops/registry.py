"""Ops, backends and the implementations they register, each with a capability check.

A backend module (loaded lazily through the ``dsv4ops.backends`` entry-point group) declares itself
with ``Backend(...)`` and registers implementations with ``backend.implements(op, target, ...)``;
a backend may register several implementations of one op (say, one per architecture), each with
its own check, tried in registration order. Nothing here imports a vendor library: a backend's
``probe`` does that when first asked, and a ``target`` (``"module:function"``) is imported on
first call. Implementations receive one argument: the op's typed args (``Op.Args``).
"""
from __future__ import annotations

import importlib
import importlib.metadata
import threading
from dataclasses import dataclass, field
from typing import Any, Callable

from . import priorities
from .platform import Platform

ENTRY_POINT_GROUP = "dsv4ops.backends"

# A capability check returns None when it accepts, else the reason it declines. It receives the
# platform and the call's DispatchKey (tensor dtypes/shapes without the leading size, non-float
# scalars, device, size_class); reading anything else raises.
Check = Callable[[Platform, Any], "str | None"]


@dataclass
class Implementation:
    op: str
    backend: "Backend"
    name: str
    target: str | Callable
    priority: int
    supports: Check | None = None
    _fn: Callable | None = field(default=None, repr=False)

    @property
    def fn(self) -> Callable:
        if self._fn is None:
            if callable(self.target):
                self._fn = self.target
            else:
                module, _, attr = self.target.partition(":")
                self._fn = getattr(importlib.import_module(module), attr)
        return self._fn

    def decline_reason(self, plat: Platform, key) -> str | None:
        """None when this implementation can serve the call on ``plat``, else why not."""
        reason = self.backend.decline_reason(plat)
        if reason is None and self.supports is not None:
            reason = self.supports(plat, key)
        return reason


@dataclass
class Backend:
    """A vendor backend. ``probe()`` returns None if its library is usable, else why not (cached)."""

    name: str
    platforms: tuple[str, ...]
    probe: Callable[[], str | None] | None = None
    description: str = ""
    implementations: dict[str, list[Implementation]] = field(default_factory=dict)
    _probed: tuple[bool, str | None] | None = field(default=None, repr=False)

    def implements(self, op: str, target: str | Callable, *, name: str | None = None, priority: int | None = None,
                   supports: Check | None = None) -> Implementation:
        """Register an implementation of ``op``; ``priority`` only for backends not in the
        priorities table (out-of-tree plugins)."""
        impls = self.implementations.setdefault(op, [])
        impl = Implementation(op, self, name or self.name, target, priorities.priority(op, self.name, priority),
                              supports)
        impls[:] = [i for i in impls if i.name != impl.name] + [impl]
        _register(impl)
        return impl

    def unavailable_reason(self) -> str | None:
        if self._probed is None:
            try:
                reason = self.probe() if self.probe else None
            except Exception as exc:  # a broken vendor install must not break dsv4ops
                reason = f"probe failed: {type(exc).__name__}: {exc}"
            self._probed = (True, reason)
        return self._probed[1]

    def decline_reason(self, plat: Platform) -> str | None:
        if plat.vendor not in self.platforms:
            return f"platform {plat.vendor} not supported (serves {', '.join(self.platforms)})"
        return self.unavailable_reason()


@dataclass(frozen=True)
class BackendInfo:
    name: str
    available: bool
    reason: str | None
    platforms: tuple[str, ...]
    ops: tuple[str, ...]
    description: str


_lock = threading.RLock()
_ops: dict[str, Any] = {}
_backends: dict[str, Backend] = {}
_implementations: dict[str, list[Implementation]] = {}
_listeners: list[Callable[[], None]] = []
_loaded = False
_load_errors: dict[str, str] = {}


def register_op(op) -> None:
    with _lock:
        _ops[op.name] = op


def op_names() -> tuple[str, ...]:
    return tuple(_ops)


def get_op(name: str):
    return _ops.get(name)


def on_change(listener: Callable[[], None]) -> None:
    """Call ``listener`` whenever implementations change (selection drops its cached decisions)."""
    _listeners.append(listener)


def _changed() -> None:
    for listener in _listeners:
        listener()


def register_backend(backend: Backend) -> Backend:
    with _lock:
        _backends[backend.name] = backend
    return backend


def unregister_backend(name: str) -> None:
    """Remove a backend and its implementations (tests, plugin reloads)."""
    with _lock:
        _backends.pop(name, None)
        for op, impls in _implementations.items():
            _implementations[op] = [i for i in impls if i.backend.name != name]
    _changed()


def _register(impl: Implementation) -> None:
    with _lock:
        impls = [i for i in _implementations.get(impl.op, [])
                 if (i.backend.name, i.name) != (impl.backend.name, impl.name)]
        impls.append(impl)
        impls.sort(key=lambda i: -i.priority)          # stable: a backend's own order is kept
        _implementations[impl.op] = impls
        _backends.setdefault(impl.backend.name, impl.backend)
    _changed()


def load_backends() -> None:
    """Import every backend module named in the ``dsv4ops.backends`` entry-point group (once)."""
    global _loaded
    if _loaded:
        return
    with _lock:
        if _loaded:
            return
        for ep in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP):
            try:
                ep.load()
            except Exception as exc:  # report, never crash the host framework
                _load_errors[ep.name] = f"{type(exc).__name__}: {exc}"
        _loaded = True


def implementations(op: str) -> list[Implementation]:
    load_backends()
    return list(_implementations.get(op, []))


def get_backend(name: str) -> Backend | None:
    load_backends()
    return _backends.get(name)


def backend_names() -> list[str]:
    load_backends()
    return sorted(_backends)


def backends() -> list[BackendInfo]:
    """Every registered backend: availability (and why not), platforms, ops."""
    load_backends()
    infos = []
    for name in sorted(_backends):
        b = _backends[name]
        reason = b.unavailable_reason()
        infos.append(BackendInfo(name, reason is None, reason, b.platforms, tuple(sorted(b.implementations)),
                                 b.description))
    for name, err in sorted(_load_errors.items()):
        infos.append(BackendInfo(name, False, f"failed to load: {err}", (), (), ""))
    return infos
