"""Warm-up (issue #31): compile every kernel variant a deployment can meet before it serves.

The variants an implementation can meet are a function of (op, platform, tuning, model dims,
engine limits): each implementation declares them beside its kernels (``implements(...,
warmup=...)``: ``warmup(dims, limits, machine)`` returns the builder parameters, the op's
conformance inputs, of calls that together ask for every variant; ``dsv4ops.deployment``).
``warmup`` gathers the declarations of every implementation of each op and runs their calls
through every selected backend that accepts them: inside a backend's ``warmup_session`` (Triton's
compiles without launching, in parallel) each call once; a vendor implementation without one runs
each call (its own JIT, if any, compiles what the call needs), and one whose JIT compiles per
leading size (``Implementation.jit_per_size``) runs at every size 1..``Limits.max_tokens``, on views
of one call built at the largest size. This module knows no backend: it iterates and reports.
"""
from __future__ import annotations

import contextlib
import functools
import importlib
import time
import warnings
from dataclasses import dataclass, field

import torch

from . import registry
from .deployment import Machine, engine_limits, model_dims
from .errors import Dsv4opsError, InputError
from .ops import OPS
from .platform import default_device, multiprocessors, platform

PROGRESS_STEP = 256                     # sizes of a per-size vendor run between progress reports
NO_GPU = ("warm-up compiles kernels for a GPU; on the CPU the Triton kernels are interpreted and nothing "
          "compiles (pass a GPU device)")


@dataclass(frozen=True)
class CompileSession:
    """What a backend's ``warmup_session`` yields: where its compiled kernels land, and why its
    implementations compile nothing here, if so (each call is then reported as declined)."""

    cache_dir: str | None = None
    declined: str | None = None


@dataclass
class OpWarmup:
    op: str
    calls: int = 0                      # representative calls
    compiled: int = 0                   # variants compiled (or loaded from a cache) now, in a backend's session
    vendor_calls: int = 0               # vendor implementation runs
    backends: set = field(default_factory=set)
    seconds: float = 0.0
    skipped: list = field(default_factory=list)      # (implementation, why) per call or declaration it declined


@dataclass
class WarmupSummary:
    """What ``warmup`` did: per op, and the variants it compiled, in how long, cached where;
    ``reason``: why it did nothing (a machine without a GPU), else None."""

    ops: list[OpWarmup]
    variants: set                       # (kernel, key) compiled or loaded by this warm-up
    seconds: float
    cache_dir: str
    platform: str
    reason: str | None = None

    def rows(self) -> list[tuple[str, ...]]:
        return [(o.op, str(o.calls), str(o.compiled), str(o.vendor_calls), ", ".join(sorted(o.backends)) or "-",
                 str(len(o.skipped)), f"{o.seconds:.2f}") for o in self.ops]

    def __str__(self) -> str:
        from ._table import render_table

        if self.reason is not None:
            return f"warm-up on {self.platform}: nothing compiled: {self.reason}"
        table = render_table(("op", "calls", "compiled variants", "vendor runs", "backends", "declined", "seconds"),
                             self.rows())
        return (f"{table}\nwarm-up on {self.platform}: {len(self.variants)} variants compiled in {self.seconds:.1f} s; "
                f"cache: {self.cache_dir}")


# -- the calls, as the implementations declare them -----------------------------------------------------

def representative_calls(op: str, dims, limits, machine: Machine) -> list[dict]:
    """Builder parameters (``OPS[op].spec.conformance.inputs``) of calls that together ask for every
    variant any implementation of ``op`` declares it can meet (each declaration's calls once)."""
    return _declared(op, dims, limits, machine)[0]


def _declared(op: str, dims, limits, machine: Machine) -> tuple[list[dict], list[tuple[str, str]]]:
    """The calls of every distinct declaration among ``op``'s implementations, in registration
    order and without repeats, and (implementation, why) for each declaration that failed."""
    calls, failed, seen = [], [], set()
    for impl in registry.implementations(op):
        if impl.warmup is None or impl.warmup in seen:
            continue
        seen.add(impl.warmup)
        try:
            declared = _load(impl.warmup)(dims, limits, machine)
        except Exception as exc:        # one implementation's broken declaration must not stop the warm-up
            failed.append((impl.name, f"warm-up declaration {impl.warmup!r} raised {type(exc).__name__}: {exc}"))
            continue
        calls += [params for params in declared if params not in calls]
    return calls, failed


@functools.lru_cache(maxsize=None)
def _imported(target: str):
    module, _, attr = target.partition(":")
    return getattr(importlib.import_module(module), attr)


def _load(declaration):
    return declaration if callable(declaration) else _imported(declaration)


def grown(op: str, args, size: int):
    """``args`` with ``OPS[op].spec.leading`` tensors of ``size`` rows (one allocation each, the same
    dimension order and dtype), their rows the call's own repeated: the largest call of a per-size
    run, which ``spec.at_size`` cuts into views."""
    changed = {}
    for name in OPS[op].spec.leading:
        t = getattr(args, name)
        if t is None:
            continue
        order = sorted(range(t.dim()), key=lambda d: (-t.stride(d), d))       # outermost first
        shape = [size if d == 0 else t.shape[d] for d in order]
        big = t.new_empty(shape).permute([order.index(d) for d in range(t.dim())])
        done = min(size, t.shape[0])
        big[:done].copy_(t[:done])
        while done < size:                                                 # doubling copies
            n = min(done, size - done)
            big[done:done + n].copy_(big[:n])
            done += n
        changed[name] = big
    return args._replace(**changed)


# -- warm-up ---------------------------------------------------------------------------------------------

def warmup(ops=None, *, model: str = "v4-flash", tp: int = 1, dims: dict | None = None, limits: dict | None = None,
           device=None, backends=None, workers: int | None = None, progress=None) -> WarmupSummary:
    """Compile every variant of ``ops`` (default: all) that calls within ``limits`` can meet, for
    every selected backend (default: all but the reference) that accepts them on ``device``.

    ``model``/``tp``: a preset's dims ("v4-flash", "v4-pro"; ``dims`` overrides fields of
    ``ModelDims``); ``limits``: fields of ``Limits`` (``dsv4ops.deployment``). A backend with a
    ``warmup_session`` (Triton: compiles without launching, on ``workers`` threads, default the CPU
    count, at most 8) gets each call once inside it; vendor implementations run each call once,
    those whose JIT compiles per leading size (``jit_per_size``) once per size 1..max_tokens (each
    run counted in ``vendor_calls``). ``progress(done, total, text)`` is called after each call
    (per-size runs: every ``PROGRESS_STEP`` sizes). A second start with the same TRITON_CACHE_DIR
    loads instead of compiling. On a machine without a GPU nothing compiles: an empty summary whose
    ``reason`` says so, and a warning."""
    ops = list(OPS) if ops is None else list(ops)
    unknown = [op for op in ops if op not in OPS]
    if unknown:
        raise InputError(f"warmup: unknown op(s) {unknown}; ops are {', '.join(OPS)}")
    model_dim = model_dims(model, tp, **(dims or {}))
    lim = engine_limits(**(limits or {}))
    device = torch.device(device) if device is not None else default_device()
    plat = platform(device)
    if plat.vendor == "cpu":
        warnings.warn(f"dsv4ops.warmup: {NO_GPU}", stacklevel=2)
        return WarmupSummary([], set(), 0.0, "-", str(plat), reason=NO_GPU)
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    machine = Machine(plat, device, multiprocessors(device))
    chosen = [b for b in (backends or registry.backend_names()) if b != "reference"]
    ops = [op for op in OPS if op in ops]
    per_op = {op: OpWarmup(op) for op in ops}
    work = []
    for op in ops:
        calls, failed = _declared(op, model_dim, lim, machine)
        per_op[op].skipped += failed
        if not calls:
            per_op[op].skipped.append(("-", f"no implementation of {op} declares warm-up calls "
                                            "(implements(..., warmup=...))"))
        work += [(op, params) for params in calls]
    compiled: set = set()
    current = [""]                      # the op whose calls run now
    vendor_work = []
    start = time.perf_counter()
    gen = torch.Generator().manual_seed(0)

    def on_compile(variant):                # a variant counts once, for the op that asked first
        if variant not in compiled:
            compiled.add(variant)
            per_op[current[0]].compiled += 1

    with contextlib.ExitStack() as stack:
        sessions = {}
        for name in chosen:
            backend = registry.get_backend(name)
            if backend is not None and backend.warmup_session is not None and backend.unavailable_reason() is None:
                sessions[name] = stack.enter_context(backend.warmup_session(machine, workers, on_compile))
        for done, (op, params) in enumerate(work, 1):
            current[0] = op
            t0 = time.perf_counter()
            call = OPS[op].validate_call(**OPS[op].spec.conformance.inputs(device, gen, **params))
            per_op[op].calls += 1
            for impl in registry.implementations(op):
                if impl.backend.name not in chosen:
                    continue
                why = impl.decline_reason(plat, call.key)
                session = sessions.get(impl.backend.name)
                if why is not None or (session is not None and session.declined is not None):
                    per_op[op].skipped.append((impl.name, why or session.declined))
                elif session is not None:
                    impl.bound(plat)(call.args)
                    per_op[op].backends.add(impl.name)
                elif impl.jit_per_size is not None and OPS[op].spec.leading:
                    vendor_work.append((op, impl, call, lim.max_tokens))
                else:
                    vendor_work.append((op, impl, call, None))
            per_op[op].seconds += time.perf_counter() - t0
            if progress is not None:
                progress(done, len(work) + sum(n or 1 for *_, n in vendor_work), f"{op} (compiling)")
    total, done = len(work) + sum(n or 1 for *_, n in vendor_work), len(work)
    for op, impl, call, sizes in vendor_work:
        t0 = time.perf_counter()
        run = impl.bound(plat)
        if sizes is None:
            calls = [call.args]
            text = f"{op} ({impl.name})"
        else:                           # every size, on views of one call built at the largest
            largest = grown(op, call.args, sizes)
            calls = (OPS[op].spec.at_size(largest, n) for n in range(1, sizes + 1))
            text = f"{op} ({impl.name}, every size up to {sizes})"
        for n, args in enumerate(calls, 1):
            try:
                run(args)
            except Dsv4opsError as exc:     # an adapter's own refusal (reported, not fatal): the run stops
                per_op[op].skipped.append((impl.name, str(exc) if sizes is None else f"at size {n}: {exc}"))
                done += (sizes or 1) - n + 1
                break
            per_op[op].vendor_calls += 1
            per_op[op].backends.add(impl.name)
            done += 1
            if progress is not None and n % PROGRESS_STEP == 0:
                progress(done, total, text)
        per_op[op].seconds += time.perf_counter() - t0
        if progress is not None:
            progress(done, total, text)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    cache_dirs = sorted({s.cache_dir for s in sessions.values() if s.cache_dir})
    return WarmupSummary([per_op[op] for op in per_op], compiled, time.perf_counter() - start,
                         ", ".join(cache_dirs) or "-", str(plat))
