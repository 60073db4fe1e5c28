"""Report a Triton compile of a dsv4ops kernel, e.g. one the engine's warm-up did not cover (issue #31).

The mode comes from ``DSV4OPS_JIT_MONITOR`` (``off``, ``warn``, ``error``; default off) or
``set_mode()``, which overrides it until ``set_mode(None)``. Whatever the mode, ``compiles()`` lists
the compiles seen while the monitor was on (``count`` mode: record, neither warn nor raise).

A compile is seen through ``triton.knobs.runtime.jit_cache_hook`` (same call on Triton 3.6 to 3.9):
Triton calls it before it compiles a JIT function for a key not in its in-memory cache, a load
from its on-disk cache included (a first call pays for either). Only kernels defined under
``dsv4ops.`` are reported; another hook installed before ours is still called. The interpreter
(``TRITON_INTERPRET=1``) never compiles, so there nothing is seen.
"""
from __future__ import annotations

import threading
import warnings
from dataclasses import dataclass

from . import settings
from .errors import ConfigError, Dsv4opsError

MODES = settings.JIT_MONITOR_MODES + ("count",)
_TRITON_PACKAGE = "dsv4ops.backends.triton."


class JitCompileError(Dsv4opsError, RuntimeError):
    """A dsv4ops kernel compiled while ``DSV4OPS_JIT_MONITOR=error``."""


class JitCompileWarning(UserWarning):
    """A dsv4ops kernel compiled while ``DSV4OPS_JIT_MONITOR=warn``."""


@dataclass(frozen=True)
class CompileEvent:
    """One compile: the op (its Triton module's name), the backend, the kernel and its variant key
    (Triton's specialization key: argument types, divisibility, constexpr values)."""

    op: str
    backend: str
    kernel: str
    variant: str

    def __str__(self) -> str:
        return f"{self.op} ({self.backend}): kernel {self.kernel} compiled for variant {self.variant}"


_override: str | None = None
_events: list[CompileEvent] = []
_lock = threading.Lock()
_installed = False
_previous_hook = None


def mode() -> str:
    """The mode in force: ``set_mode``'s, else ``DSV4OPS_JIT_MONITOR``'s."""
    return _override if _override is not None else settings.current().jit_monitor


def set_mode(new_mode: str | None) -> None:
    """Set the mode (one of MODES) for this process; None: back to ``DSV4OPS_JIT_MONITOR``.
    The Triton backend installs the hook when it loads; this installs it too, for kernels run otherwise."""
    global _override
    if new_mode is not None and new_mode not in MODES:
        raise ConfigError(f"jit monitor mode={new_mode!r}: expected one of {', '.join(MODES)} or None")
    _override = new_mode
    if mode() != "off":
        install()


def compiles() -> list[CompileEvent]:
    """The compiles seen so far (while the mode was not off)."""
    with _lock:
        return list(_events)


def clear() -> None:
    with _lock:
        _events.clear()


def install() -> bool:
    """Chain our hook into Triton's ``jit_cache_hook`` (once); False where Triton has no such hook."""
    global _installed, _previous_hook
    if _installed:
        return True
    try:
        from triton import knobs
    except ImportError:
        return False
    runtime = getattr(knobs, "runtime", None)
    if runtime is None or not hasattr(runtime, "jit_cache_hook"):
        return False
    _previous_hook = runtime.jit_cache_hook
    runtime.jit_cache_hook = _cache_hook
    _installed = True
    return True


def _cache_hook(*, key, repr, fn, compile, is_manual_warmup, already_compiled, **rest):
    """Triton's hook signature; returning True would skip the compile, so we pass on the previous hook's answer."""
    previous = None
    if _previous_hook is not None:
        previous = _previous_hook(key=key, repr=repr, fn=fn, compile=compile, is_manual_warmup=is_manual_warmup,
                                  already_compiled=already_compiled, **rest)
    observe(str(fn.module), fn.name, key)
    return previous


def observe(module: str, kernel: str, variant) -> CompileEvent | None:
    """Record (and warn about or raise for, per the mode) a compile of ``kernel`` from ``module``."""
    current_mode = mode()
    if current_mode == "off" or not module.startswith("dsv4ops."):
        return None
    if module.startswith(_TRITON_PACKAGE):
        op, backend = module[len(_TRITON_PACKAGE):], "triton"
    else:
        op, backend = module, module.split(".")[2] if module.startswith("dsv4ops.backends.") else "dsv4ops"
    event = CompileEvent(op, backend, kernel, str(variant))
    with _lock:
        _events.append(event)
    if current_mode == "warn":
        warnings.warn(f"JIT compile after warm-up: {event}", JitCompileWarning, stacklevel=3)
    elif current_mode == "error":
        raise JitCompileError(f"JIT compile after warm-up: {event} (DSV4OPS_JIT_MONITOR=error; "
                              f"add this shape to the warm-up limits)")
    return event
