"""The Triton backend's warm-up session (``Backend.warmup_session``): inside it, a launch of any
Triton kernel compiles its variant when new (on a thread pool, Triton's async compile mode where
this Triton has it) and returns without running; each variant not yet in this process's cache is
reported; on exit every compile has finished and, on a GPU, every kernel is loaded.

``variant_keys`` returns the Triton variants a function asks for without compiling anything
(Triton's own key, computed by the launch path), which is how tests/test_warmup.py holds the set
that the ops' ``warmup_calls`` declarations reach closed.
"""
from __future__ import annotations

import contextlib
import os

from dsv4ops import jit_monitor
from dsv4ops.backend_support import triton_interpreter_enabled
from dsv4ops.warm_up import CompileSession

DEFAULT_WORKERS = 8                     # compile threads at most, by default


@contextlib.contextmanager
def session(machine, workers: int | None, on_compile):
    """``on_compile((kernel, key))`` per variant compiled (or loaded from the disk cache) now, on
    ``machine`` (``dsv4ops.deployment.Machine``); yields a ``CompileSession``: where compiled kernels
    land and, under the interpreter, why nothing compiles."""
    if triton_interpreter_enabled():
        yield CompileSession(cache_dir(), declined="TRITON_INTERPRET=1: the interpreter compiles nothing")
        return

    def on_miss(fn, key):
        on_compile((fn.name, str(key)))
        return False                    # compile it

    with _compile_phase(workers, load=machine.device.type == "cuda"), _cache_hook(on_miss):
        yield CompileSession(cache_dir())


def cache_dir() -> str:
    """Where Triton keeps compiled kernels (TRITON_CACHE_DIR, else its default)."""
    try:
        from triton import knobs

        return str(knobs.cache.dir)
    except (ImportError, AttributeError):
        return os.environ.get("TRITON_CACHE_DIR") or os.path.join(os.path.expanduser("~"), ".triton", "cache")


def variant_keys(run) -> set[tuple[str, str]]:
    """The (kernel, Triton key) of every Triton variant ``run()`` asks for that is not compiled in
    this process yet, compiling and launching none of them. The key is the one the launch path
    computes (argument types, integer and alignment specialization, constexprs, options)."""
    asked: set[tuple[str, str]] = set()

    def record(fn, key):
        asked.add((fn.name, str(key)))
        return True                     # skip the compile and the launch

    with _cache_hook(record):
        run()
    return asked


@contextlib.contextmanager
def _cache_hook(on_miss):
    """Route Triton's ``jit_cache_hook`` (called before it compiles a key not in its in-memory cache)
    to ``on_miss(fn, key) -> bool`` (True: skip the compile and the launch); the previous hook is
    restored on exit."""
    from triton import knobs

    jit_monitor.install()               # first, so that restoring ``previous`` keeps the monitor's hook
    previous = knobs.runtime.jit_cache_hook

    def hook(*, key, fn, **rest):
        return on_miss(fn, key)

    knobs.runtime.jit_cache_hook = hook
    try:
        yield
    finally:
        knobs.runtime.jit_cache_hook = previous


@contextlib.contextmanager
def compile_without_launching(kernels: list | None = None):
    """Every Triton launch compiles its variant (when new) and returns without running; the
    compiled kernels (or their futures, under async compiling) are appended to ``kernels``."""
    from triton.runtime.jit import JITFunction

    launch = JITFunction.run

    def compile_only(self, *args, grid, warmup, **kwargs):
        kernel = launch(self, *args, grid=grid, warmup=True, **kwargs)
        if kernels is not None:
            kernels.append(kernel)
        return kernel

    JITFunction.run = compile_only
    try:
        yield
    finally:
        JITFunction.run = launch


@contextlib.contextmanager
def _compile_phase(workers: int | None, load: bool):
    """Triton launches compile without running, on ``workers`` threads (default: the CPU count, at
    most ``DEFAULT_WORKERS``); every compile has finished on exit, and with ``load`` every kernel is
    loaded onto the current GPU."""
    from concurrent.futures import ThreadPoolExecutor

    try:
        from triton.runtime._async_compile import AsyncCompileMode
    except ImportError:
        AsyncCompileMode = None
    workers = workers or min(DEFAULT_WORKERS, os.cpu_count() or 1)
    kernels: list = []
    with compile_without_launching(kernels):
        if AsyncCompileMode is None or workers <= 1:
            yield
        else:
            with ThreadPoolExecutor(workers) as pool, AsyncCompileMode(pool):
                yield
    if load:
        _load(kernels)


def _load(kernels: list):
    """Load compiled kernels onto the current GPU and build their launchers, which Triton otherwise
    does at a kernel's first launch (a module load and, per argument signature, a C launcher: 0.2 to
    0.6 s on the H100, docs/perf/README.md)."""
    for kernel in kernels:
        kernel = kernel.result() if hasattr(kernel, "result") else kernel
        init = getattr(kernel, "_init_handles", None)
        if init is not None:
            init()
