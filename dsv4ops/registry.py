"""Ops, backends and the implementations they register, each with a capability check.

A backend module (loaded lazily through the ``dsv4ops.backends`` entry-point group) declares itself
with ``Backend(...)`` and registers implementations with ``backend.implements(op, target, ...)``;
a backend may register several implementations of one op (say, one per architecture), each with
its own check, tried in registration order. Nothing here imports a vendor library: a backend's
``probe`` does that when first asked, and a ``target`` (``"module:function"``) is imported when
its implementation is first chosen (one that cannot be imported declines). Implementations receive
the op's typed args (``Op.Args``); a backend with a ``context`` (say, its tuning for the platform)
has it computed once per decision and passed first: ``fn(context(platform), args)``.

Plugins (out-of-tree entry points) cannot break or impersonate: in-tree backends load first; a
plugin may not take an in-tree backend's name (``priorities.PRIORITY``) or a name already taken; a
plugin whose import raises (``SystemExit`` and ``KeyboardInterrupt`` included) or is refused leaves
nothing registered and is listed by ``backends()`` with the reason; a capability check, probe or
measured preference that raises declines that implementation with the exception as its reason.
"""
from __future__ import annotations

import functools
import importlib
import importlib.metadata
import threading
from dataclasses import dataclass, field
from typing import Any, Callable

from . import priorities
from .errors import ConfigError
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
    cannot_capture: str | None = None      # why a CUDA graph cannot capture it (None: it can)
    jit_per_size: str | None = None        # why its JIT compiles per value of the call's leading size
    warmup: str | Callable | None = None   # warmup(dims, limits, machine) -> builder parameters of its warm-up calls
    _fn: Callable | None = field(default=None, repr=False)

    def bound(self, plat: Platform) -> Callable[[Any], Any]:
        """What runs a call on ``plat``: ``fn`` taking the typed args, with the backend's context for
        ``plat`` bound once (the decision's, not looked up per call)."""
        context = self.backend.context
        return self.fn if context is None else functools.partial(self.fn, context(plat))

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
        """None when this implementation can serve the call on ``plat`` (its target imported), else
        why not; a check that raises declines with the exception as the reason (it must not break
        other backends), except a ``ConfigError``: the user's bad setting (a malformed
        ``DSV4OPS_TRITON_TUNING`` the check reads, say) is the caller's error, never a decline."""
        try:
            reason = self.backend.decline_reason(plat)
            if reason is None:
                reason = priorities.preference_error(self.op, plat, key, self.backend.name)
            if reason is None and self.supports is not None:
                reason = self.supports(plat, key)
        except ConfigError:
            raise
        except _CHECK_FAILURES as exc:
            return f"capability check raised {type(exc).__name__}: {exc}"
        if reason is not None:
            return str(reason)
        try:
            self.fn
        except _CHECK_FAILURES as exc:
            return f"cannot load {self.target}: {type(exc).__name__}: {exc}"
        return None


@dataclass
class Backend:
    """A vendor backend. ``probe()`` returns None if its library is usable, else why not (cached);
    ``context(platform)``, if given, is what every implementation gets before the typed args;
    ``warmup_session(machine, workers, on_compile)``, if given, a context manager inside which its
    implementations compile what a call needs without running it (``dsv4ops.warm_up.warmup``)."""

    name: str
    platforms: tuple[str, ...]
    probe: Callable[[], str | None] | None = None
    description: str = ""
    context: Callable[[Platform], Any] | None = None
    warmup_session: Callable[..., Any] | None = None    # compile without running (dsv4ops.warm_up.warmup)
    implementations: dict[str, list[Implementation]] = field(default_factory=dict)
    _probed: tuple[bool, str | None] | None = field(default=None, repr=False)

    def implements(self, op: str, target: str | Callable, *, name: str | None = None, priority: int | None = None,
                   supports: Check | None = None, cannot_capture: str | None = None,
                   jit_per_size: str | None = None, warmup: str | Callable | None = None) -> Implementation:
        """Register an implementation of ``op``; ``priority`` only for backends not in the
        priorities table (out-of-tree plugins); ``cannot_capture``: why a CUDA graph cannot capture
        it (a host synchronization, say), so that selection skips it while a stream is capturing;
        ``jit_per_size``: why its JIT compiles (or picks) a kernel per value of the call's leading
        size (the op's ``OpSpec.leading``), so that warm-up runs it at every size up to the limit;
        ``warmup`` (a callable or ``"module:function"``, imported when warm-up first asks):
        ``warmup(dims, limits, machine)`` returns the builder parameters (the op's conformance
        inputs) of calls that together reach every variant it can compile (``dsv4ops.deployment``)."""
        if priority is not None and (isinstance(priority, bool) or not isinstance(priority, int)):
            raise ConfigError(f"backend {self.name!r}: priority= must be an int, got {priority!r}")
        impl = Implementation(op, self, name or self.name, target, priorities.priority(op, self.name, priority),
                              supports, cannot_capture, jit_per_size, warmup)
        _register(impl)
        impls = self.implementations.setdefault(op, [])
        impls[:] = [i for i in impls if i.name != impl.name] + [impl]
        return impl

    def unavailable_reason(self) -> str | None:
        if self._probed is None:
            try:
                reason = self.probe() if self.probe else None
            except _CHECK_FAILURES as exc:  # a broken vendor install must not break dsv4ops
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


# What a plugin's code may raise without breaking dsv4ops: reported, never propagated. Imports also
# catch KeyboardInterrupt (a plugin's import must not end the host's first call).
_CHECK_FAILURES = (Exception, SystemExit)
_IMPORT_FAILURES = (Exception, SystemExit, KeyboardInterrupt)

_lock = threading.RLock()
_ops: dict[str, Any] = {}                 # the op table: name -> Op, in docs/ops.md section order
_backends: dict[str, Backend] = {}
_implementations: dict[str, list[Implementation]] = {}
_listeners: list[Callable[[], None]] = []
_loaded = False
_load_errors: dict[str, str] = {}
_loading = False                          # load_backends is running (a backend module may call back)
_loading_plugin: str | None = None        # the plugin entry point being imported, if any


def register_op(op) -> None:
    """Enter ``op`` in the op table (``opspec.define`` does, for each op module), kept in the order
    of the ops' sections in docs/ops.md."""
    with _lock:
        _ops[op.name] = op
        ordered = sorted(_ops.values(), key=lambda o: o.spec.section)
        _ops.clear()
        _ops.update((o.name, o) for o in ordered)


def op_table() -> dict[str, Any]:
    """The op table itself (``dsv4ops.ops.OPS``): op name -> its Op."""
    return _ops


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
    """Make ``backend`` known; ConfigError if its name is taken (see ``_claim``)."""
    with _lock:
        _claim(backend)
        _backends[backend.name] = backend
    return backend


def _claim(backend: Backend) -> None:
    """Refuse a name held by another backend object, and, while a plugin loads, an in-tree name."""
    holder = _backends.get(backend.name)
    if holder is not None and holder is not backend:
        raise ConfigError(f"backend name {backend.name!r} is already taken by another backend "
                          f"({holder.description or 'registered earlier'}); choose another name")
    if _loading_plugin is not None and backend.name in priorities.PRIORITY:
        raise ConfigError(f"backend name {backend.name!r} belongs to an in-tree dsv4ops backend; "
                          f"a plugin must choose another name")


def unregister_backend(name: str) -> None:
    """Remove a backend and its implementations (tests, plugin reloads)."""
    with _lock:
        _backends.pop(name, None)
        for op, impls in _implementations.items():
            _implementations[op] = [i for i in impls if i.backend.name != name]
    _changed()


def _register(impl: Implementation) -> None:
    with _lock:
        _claim(impl.backend)
        impls = [i for i in _implementations.get(impl.op, [])
                 if (i.backend.name, i.name) != (impl.backend.name, impl.name)]
        impls.append(impl)
        impls.sort(key=lambda i: -i.priority)          # stable: a backend's own order is kept
        _implementations[impl.op] = impls
        _backends.setdefault(impl.backend.name, impl.backend)
    _changed()


def _in_tree(ep) -> bool:
    return ep.value.partition(":")[0].startswith("dsv4ops.")


def load_backends() -> None:
    """Import every backend module named in the ``dsv4ops.backends`` entry-point group (once):
    the in-tree ones first, then plugins, each of which either loads whole or leaves nothing."""
    global _loaded, _loading
    if _loaded:
        return
    with _lock:
        if _loaded or _loading:
            return
        _loading = True
        try:
            eps = list(importlib.metadata.entry_points(group=ENTRY_POINT_GROUP))
            for ep in sorted(eps, key=lambda ep: not _in_tree(ep)):       # stable: in-tree first
                if _in_tree(ep):
                    _load(ep, ep.name)
                elif ep.name in priorities.PRIORITY:
                    _load_errors[f"{ep.name} ({ep.value})"] = (f"refused: plugin entry point {ep.value!r} uses "
                                                               f"the name of the in-tree backend {ep.name!r}")
                else:
                    _load_plugin(ep)
            _loaded = True
        finally:
            _loading = False


def _load(ep, label: str) -> bool:
    try:
        ep.load()
        return True
    except _IMPORT_FAILURES as exc:  # report, never crash the host framework
        _load_errors[label] = f"failed to load: {type(exc).__name__}: {exc}"
        return False


def _load_plugin(ep) -> None:
    """Import a plugin; if that fails or is refused, undo whatever it registered."""
    global _loading_plugin
    backends_before = dict(_backends)
    impls_before = {op: list(impls) for op, impls in _implementations.items()}
    _loading_plugin = ep.name
    try:
        ok = _load(ep, ep.name if ep.name not in _backends else f"{ep.name} ({ep.value})")
    finally:
        _loading_plugin = None
    if not ok:
        _backends.clear()
        _backends.update(backends_before)
        _implementations.clear()
        _implementations.update(impls_before)
        _changed()


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
        infos.append(BackendInfo(name, False, err, (), (), ""))
    return infos
