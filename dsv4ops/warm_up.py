"""Warm-up (issue #31): compile every kernel variant a deployment can meet before it serves.

A Triton kernel compiles once per variant: the compile-time choices its launcher makes from the
call's sizes (tiles, split or not, resident or streamed top-k and its power-of-two width class,
layouts, optional arguments) and Triton's specialization of the integer and pointer arguments.
The arguments that change every step (tokens, rows, contexts, row pitches, split counts, the row
bounds' addresses) are ``do_not_specialize`` in the kernels, so the variants an op can meet are a
function of (op, platform, tuning, model dims, engine limits): ``representative_calls`` gives one
call (builder parameters of the op's conformance inputs) per variant, and ``warmup`` runs them
through every selected backend that accepts them: Triton kernels compile without launching (in
parallel), vendor implementations run once (their own JIT, if any, compiles what the call needs),
and a vendor implementation whose JIT compiles per leading size (``Implementation.jit_per_size``)
runs at every size 1..``Limits.max_tokens``, on views of one call built at the largest size.

``variant_keys`` returns the Triton variants a call asks for without compiling anything (Triton's
own key, computed by the launch path), which is how tests/test_warmup.py holds the set closed.
"""
from __future__ import annotations

import contextlib
import dataclasses
import functools
import os
import time
from dataclasses import dataclass, field

import torch

from . import formats, jit_monitor, registry, shapes
from .backend_support import triton_interpreter_enabled
from .errors import Dsv4opsError, InputError, UnsupportedError
from .ops import OP_NAMES, OPS
from .ops.candidate_blocks import CANDIDATE_BLOCK, CANDIDATE_BLOCKS
from .platform import default_device, multiprocessors, platform

PRESETS = {"v4-flash": "flash", "v4-pro": "pro"}
TP_DEGREES = (1, 2, 4, 8)
TOPK_MODES = ("ranges", "decode1d", "decode2d")
PROGRESS_STEP = 256                     # sizes of a per-size vendor run between progress reports


@dataclass(frozen=True)
class ModelDims:
    """A model's dimensions per tensor-parallel rank (docs/ops.md §0)."""

    heads: int                          # attention query heads
    o_groups: int                       # output-projection groups (fp8_einsum's H)
    index_topk: int                     # indexer selections per token
    index_heads: int = shapes.INDEX_HEADS
    window: int = shapes.WINDOW         # sliding-window selections per token
    o_lora_rank: int = shapes.O_LORA_RANK   # fp8_einsum's D
    o_group_k: int = shapes.O_GROUP_K       # fp8_einsum's R
    v41_index_heads: int = shapes.V41_INDEX_HEADS   # the two-level indexer's heads (V4.1)
    candidate_block: int = CANDIDATE_BLOCK      # positions per candidate block (candidate_blocks' sparse_block)
    candidate_blocks: int = CANDIDATE_BLOCKS    # candidate blocks per row (candidate_blocks' num_blocks)


def model_dims(preset: str = "v4-flash", tp: int = 1, **overrides) -> ModelDims:
    """``preset`` ("v4-flash", "v4-pro") at tensor parallelism ``tp``, fields overridden by keyword."""
    if preset not in PRESETS:
        raise InputError(f"model preset {preset!r}: expected one of {', '.join(PRESETS)}")
    if tp not in TP_DEGREES:
        raise InputError(f"tp={tp}: expected one of {TP_DEGREES}")
    name, rank = PRESETS[preset], TP_DEGREES.index(tp)
    dims = ModelDims(heads=shapes.HEADS_PER_RANK[name][rank], o_groups=shapes.O_GROUPS_PER_RANK[name][rank],
                     index_topk=shapes.INDEX_TOPK[name])
    return _replace(dims, overrides, "model")


@dataclass(frozen=True)
class Limits:
    """What an engine's steps can ask for. ``max_context`` counts tokens; the indexer's rows are C4
    compressed tokens (a quarter), rounded up to whole ``c4_block`` pages."""

    max_tokens: int = 8192              # tokens per step (a prefill chunk, or decode requests x next_n)
    max_context: int = 131072           # tokens of one request's context
    next_n: int = 1                     # rows per decode request (1 + MTP draft tokens)
    swa_block: int = shapes.SWA_BLOCK   # page size (tokens) of the sliding-window cache
    c4_block: int = shapes.C4_BLOCK     # page size (compressed tokens) of the C4 caches
    c128_block: int = shapes.C128_BLOCK  # page size (compressed tokens) of the C128 cache
    layouts: tuple[str, ...] = ("fp8_ds_mla",)   # attention cache layouts
    topk_modes: tuple[str, ...] = TOPK_MODES      # how indexer_topk gets its rows (indexer_topk's modes)
    index_layouts: tuple[str, ...] = tuple(formats.INDEX_LAYOUTS)   # indexer key caches (two-level ops)

    @property
    def index_width(self) -> int:
        """The widest indexer row: the C4 compressed tokens of ``max_context``, whole pages."""
        entries = -(-self.max_context // 4)
        return -(-entries // self.c4_block) * self.c4_block


def engine_limits(**values) -> Limits:
    """Limits with the given fields (a clear error naming an unknown one or a bad value)."""
    lim = _replace(Limits(), values, "limits")
    for name in ("max_tokens", "max_context", "next_n", "swa_block", "c4_block", "c128_block"):
        if getattr(lim, name) < 1:
            raise InputError(f"limits: {name}={getattr(lim, name)} must be at least 1")
    bad = [m for m in lim.topk_modes if m not in TOPK_MODES]
    if bad:
        raise InputError(f"limits: topk_modes {bad} unknown; expected some of {', '.join(TOPK_MODES)}")
    bad = [x for x in lim.index_layouts if x not in formats.INDEX_LAYOUTS]
    if bad:
        raise InputError(f"limits: index_layouts {bad} unknown; expected some of {', '.join(formats.INDEX_LAYOUTS)}")
    return lim


def _replace(obj, values: dict, what: str):
    names = {f.name for f in dataclasses.fields(obj)}
    unknown = sorted(set(values) - names)
    if unknown:
        raise InputError(f"{what}: unknown field(s) {', '.join(unknown)}; fields are {', '.join(sorted(names))}")
    return dataclasses.replace(obj, **values)


# -- one call per variant -------------------------------------------------------------------------------

@dataclass(frozen=True)
class Context:
    """What the variant choices read besides dims and limits: the Triton tunables, threads per warp
    and the multiprocessors the grids fill (``dsv4ops.platform.multiprocessors``)."""

    tune: object
    lanes: int
    sms: int


@functools.lru_cache(maxsize=16)
def topk_sizes(k: int, max_rows: int, max_width: int, ctx: Context, step: int = 1) -> tuple[tuple[int, int], ...]:
    """(rows, width) calls, rows a multiple of ``step`` (MTP rows per request), that together reach
    every launch variant of indexer_topk (``launch_variants``: one launch, or pieces then
    candidates, each resident at a power-of-two width class or streamed; or the threshold path,
    whose sample grows with the width's power-of-two class) up to the limits. Widths: powers of
    two, p times them (pieces of exactly that class), one more and 16 more (row pitch classes 1
    and 16 just past a class boundary); rows: the smallest of
    each ``cdiv(sms, rows)`` class (fewer rows split more), and the most."""
    from dsv4ops.backends.triton.indexer_topk import launch_variants

    row_set = {min(max_rows, -(-max_rows // step) * step)}
    for r in range(step, min(max_rows, ctx.sms + step) + 1, step):
        row_set.add(r)
    by_class = {}
    for r in sorted(row_set):
        by_class.setdefault(-(-ctx.sms // r) if r < ctx.sms else 0, r)
    pieces = max(-(-max_width // ctx.tune.topk_resident), ctx.sms)
    widths = {max_width}
    b = 1
    while b <= max_width:
        widths.update(w for p in range(1, pieces + 1) for w in (p * b, p * b + 1, p * b + 16) if w <= max_width)
        b *= 2
    seen, calls = set(), []
    for r in by_class.values():
        for w in sorted(widths):
            new = set(launch_variants(r, w, k, ctx.tune, ctx.lanes, ctx.sms)) - seen
            if new:
                seen |= new
                calls.append((r, w))
    return tuple(calls)


def fused_topk_rows(k: int, tile: int, max_rows: int, ctx: Context, step: int = 1) -> tuple[int, ...]:
    """Row counts (multiples of ``step``, at most ``max_rows``) that together reach every pieces
    count of the fused indexers' plan (``streaming_topk.plan``: it sets the merge's block and
    specializes ``pieces == 1``): the fewest rows of each."""
    from dsv4ops.backends.triton.streaming_topk import plan

    by_pieces = {}
    most = min(max_rows, ctx.tune.fused_programs_per_sm * ctx.sms + step)
    for rows in range(step, max(most, step) + 1, step):
        by_pieces.setdefault(plan(rows, k, tile, ctx.tune, ctx.sms).pieces, rows)
    return tuple(by_pieces.values())


def representative_calls(op: str, dims: ModelDims, lim: Limits, ctx: Context) -> list[dict]:
    """Builder parameters (``OPS[op].spec.conformance.inputs``) of calls that together ask for every
    Triton variant ``op`` can meet within ``lim``."""
    heads, layouts = dims.heads, lim.layouts
    if op == "qnorm_rope_kv_insert":
        return [dict(T=2, H=heads, layout=lay, block_size=lim.swa_block) for lay in layouts]
    if op in ("sparse_mla_decode", "sparse_mla_prefill"):
        # T=1 splits the index list across programs (few programs), T=sms does not; SWA-only,
        # SWA + C4 (the indexer's top-k) and SWA + C128 (every compressed token) layers.
        extras = ((0, lim.c4_block), (dims.index_topk, lim.c4_block),
                  (-(-lim.max_context // 128), lim.c128_block))
        return [dict(T=T, H=heads, topk=dims.window, layout=lay, block_size=lim.swa_block, extra_topk=xt,
                     extra_block_size=xb)
                for T in sorted({1, max(1, min(lim.max_tokens, ctx.sms))}) for lay in layouts for xt, xb in extras]
    if op == "inv_rope_fp8_quant":
        return [dict(T=2, H=heads, n_groups=dims.o_groups)]
    if op == "fp8_einsum":
        # One Triton variant per layout (B is not specialized); ``out`` given, so that a vendor run at
        # every size (jit_per_size) writes views of one output.
        return [dict(B=min(4, lim.max_tokens), H=dims.o_groups, D=dims.o_lora_rank, R=dims.o_group_k, group_major=g,
                     out=True) for g in (False, True)]
    if op == "mqa_logits":
        return [dict(T=4, S=256, H=dims.index_heads, clean=c) for c in (False, True)]
    if op == "paged_mqa_logits":
        return [dict(B=1, next_n=lim.next_n, context=2 * lim.c4_block, H=dims.index_heads, block_size=lim.c4_block,
                     lens_dim=d, clean=c) for d in (1, 2) for c in (False, True)]
    if op == "indexer_topk":
        calls = []
        for mode in lim.topk_modes:
            step = 1 if mode == "ranges" else lim.next_n
            for R, W in topk_sizes(dims.index_topk, lim.max_tokens, lim.index_width, ctx, step):
                calls.append(dict(R=R, W=W, k=dims.index_topk, mode=mode, next_n=step))
        return calls
    if op == "compress_kv_insert":
        kinds = [(lay, 4, lim.c4_block) for lay in layouts if lay == "fp8_ds_mla"]
        kinds += [(lay, 128, lim.c128_block) for lay in layouts if lay == "fp8_ds_mla"]
        kinds.append(("index_fp8", 4, lim.c4_block))
        return [dict(layout=lay, ratio=r, block_size=bs, reqs=((0, r),)) for lay, r, bs in kinds]
    # The two-level indexer (V4.1): its widths, rows, table pitches and bounds' addresses are not
    # specialized, so its variants are the row forms, key layouts, length forms and the clean flag,
    # and candidate_blocks' logits row pitch W: 1, a multiple of 16 or neither (Triton's classes).
    blocks = dict(sparse_block=dims.candidate_block, num_blocks=dims.candidate_blocks)
    if op == "candidate_blocks":
        return [dict(R=step, W=W, mode=mode, next_n=step, **blocks) for W in (1, 16, 17)
                for mode in lim.topk_modes for step in (1 if mode == "ranges" else lim.next_n,)]
    if op == "sparse_mqa_logits":
        return [dict(T=4, S=4 * dims.candidate_block, H=dims.v41_index_heads, clean=c, **blocks) for c in (False, True)]
    if op == "paged_sparse_mqa_logits":
        return [dict(B=1, next_n=lim.next_n, context=2 * lim.c4_block, H=dims.v41_index_heads, block_size=lim.c4_block,
                     layout=lay, lens_dim=d, clean=c, **blocks)
                for lay in lim.index_layouts for d in (1, 2) for c in (False, True)]
    if op == "mqa_topk":
        k = dims.index_topk
        return [dict(T=rows, S=256, H=dims.index_heads, topk=k)
                for rows in fused_topk_rows(k, ctx.tune.mqa_block_s, lim.max_tokens, ctx)]
    if op == "paged_mqa_topk":
        # Requests whose logits fit fused_chunk_bytes run logits and top-k in chunks (their variants
        # are those two ops'); longer ones, where the limits allow them, the fused kernel.
        n, k = lim.next_n, dims.index_topk
        contexts = [2 * lim.c4_block]
        if n * lim.index_width * 4 > ctx.tune.fused_chunk_bytes:
            contexts.append(lim.index_width)
        return [dict(B=rows // n, next_n=n, context=c, H=dims.index_heads, block_size=lim.c4_block, lens_dim=d, topk=k)
                for c in contexts for rows in fused_topk_rows(k, ctx.tune.logits_block_t, lim.max_tokens, ctx, n)
                for d in (1, 2)]
    raise InputError(f"warm-up knows no variants of op {op!r}")


def context(plat, device) -> Context:
    from dsv4ops.backends.triton.tuning import tuning, warp_lanes

    return Context(tuning(plat), warp_lanes(plat), multiprocessors(device))


# -- Triton's variant keys, recorded or compiled ---------------------------------------------------------

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
def _compile_without_launching(kernels: list | None = None):
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


def _load(kernels: list):
    """Load compiled kernels onto the current GPU and build their launchers, which Triton otherwise
    does at a kernel's first launch (a module load and, per argument signature, a C launcher: 0.2 to
    0.6 s on the H100, docs/perf/README.md)."""
    for kernel in kernels:
        kernel = kernel.result() if hasattr(kernel, "result") else kernel
        init = getattr(kernel, "_init_handles", None)
        if init is not None:
            init()


def variant_keys(run) -> set[tuple[str, str]]:
    """The (kernel, Triton key) of every Triton variant ``run()`` asks for that is not compiled in
    this process yet, compiling and launching none of them. The key is the one the launch path
    computes (argument types, integer and alignment specialization, constexprs, options)."""
    asked: set[tuple[str, str]] = set()

    def record(fn, key):
        asked.add((fn.name, str(key)))
        return True

    with _cache_hook(record):
        run()
    return asked


# -- warm-up ---------------------------------------------------------------------------------------------

@dataclass
class OpWarmup:
    op: str
    calls: int = 0                      # representative calls
    compiled: int = 0                   # Triton variants compiled (or loaded from the cache) now
    vendor_calls: int = 0               # vendor implementation runs
    backends: set = field(default_factory=set)
    seconds: float = 0.0
    skipped: list = field(default_factory=list)      # (implementation, why) per call it declined


@dataclass
class WarmupSummary:
    """What ``warmup`` did: per op, and the Triton variants it compiled, in how long, cached where."""

    ops: list[OpWarmup]
    variants: set                       # (kernel, Triton key) compiled or loaded by this warm-up
    seconds: float
    cache_dir: str
    platform: str

    def rows(self) -> list[tuple[str, ...]]:
        return [(o.op, str(o.calls), str(o.compiled), str(o.vendor_calls), ", ".join(sorted(o.backends)) or "-",
                 str(len(o.skipped)), f"{o.seconds:.2f}") for o in self.ops]

    def __str__(self) -> str:
        from ._table import render_table

        table = render_table(("op", "calls", "Triton variants", "vendor runs", "backends", "declined", "seconds"),
                             self.rows())
        return (f"{table}\nwarm-up on {self.platform}: {len(self.variants)} Triton variants in {self.seconds:.1f} s; "
                f"Triton cache: {self.cache_dir}")


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


def triton_cache_dir() -> str:
    """Where Triton keeps compiled kernels (TRITON_CACHE_DIR, else its default)."""
    try:
        from triton import knobs

        return str(knobs.cache.dir)
    except (ImportError, AttributeError):
        return os.environ.get("TRITON_CACHE_DIR") or os.path.join(os.path.expanduser("~"), ".triton", "cache")


def warmup(ops=None, *, model: str = "v4-flash", tp: int = 1, dims: dict | None = None, limits: dict | None = None,
           device=None, backends=None, workers: int | None = None, progress=None) -> WarmupSummary:
    """Compile every variant of ``ops`` (default: all) that calls within ``limits`` can meet, for
    every selected backend (default: all but the reference) that accepts them on ``device``.

    ``model``/``tp``: a preset's dims ("v4-flash", "v4-pro"; ``dims`` overrides fields of
    ``ModelDims``); ``limits``: fields of ``Limits``. Triton variants compile without launching on
    ``workers`` threads (default: the CPU count, at most 8); vendor implementations run each call
    once, those whose JIT compiles per leading size (``jit_per_size``) once per size 1..max_tokens
    (each run counted in ``vendor_calls``). ``progress(done, total, text)`` is called after each
    call (per-size runs: every ``PROGRESS_STEP`` sizes). A second start with the same
    TRITON_CACHE_DIR loads instead of compiling."""
    from .backends.triton import BACKEND as TRITON

    ops = list(OP_NAMES) if ops is None else list(ops)
    unknown = [op for op in ops if op not in OP_NAMES]
    if unknown:
        raise InputError(f"warmup: unknown op(s) {unknown}; ops are {', '.join(OP_NAMES)}")
    model_dim = model_dims(model, tp, **(dims or {}))
    lim = engine_limits(**(limits or {}))
    device = torch.device(device) if device is not None else default_device()
    plat = platform(device)
    if plat.vendor == "cpu":
        raise UnsupportedError("warm-up compiles kernels for a GPU; on the CPU the Triton kernels are interpreted "
                               "and nothing compiles (pass a GPU device)")
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    ctx = context(plat, device)
    chosen = [b for b in (backends or registry.backend_names()) if b != "reference"]
    ops = [op for op in OP_NAMES if op in ops]
    work = [(op, params) for op in ops for params in representative_calls(op, model_dim, lim, ctx)]
    per_op = {op: OpWarmup(op) for op in ops}
    compiled: set = set()
    current = [""]                      # the op whose calls run now
    vendor_work = []
    start = time.perf_counter()
    gen = torch.Generator().manual_seed(0)

    def on_miss(fn, key):                   # a variant counts once, for the op that asked first
        variant = (fn.name, str(key))
        if variant not in compiled:
            compiled.add(variant)
            per_op[current[0]].compiled += 1
        return False

    with _compile_phase(workers, load=device.type == "cuda"), _cache_hook(on_miss):
        for done, (op, params) in enumerate(work, 1):
            current[0] = op
            t0 = time.perf_counter()
            call = OPS[op].validate_call(**OPS[op].spec.conformance.inputs(device, gen, **params))
            per_op[op].calls += 1
            for impl in registry.implementations(op):
                if impl.backend.name not in chosen:
                    continue
                why = impl.decline_reason(plat, call.key)
                if why is not None:
                    per_op[op].skipped.append((impl.name, why))
                elif impl.backend is TRITON and triton_interpreter_enabled():
                    per_op[op].skipped.append((impl.name, "TRITON_INTERPRET=1: the interpreter compiles nothing"))
                elif impl.backend is TRITON:
                    impl.bound(plat)(call.args)
                    per_op[op].backends.add(impl.name)
                elif impl.jit_per_size is not None and OPS[op].spec.leading:
                    vendor_work.append((op, impl, call, lim.max_tokens))
                else:
                    vendor_work.append((op, impl, call, None))
            per_op[op].seconds += time.perf_counter() - t0
            if progress is not None:
                progress(done, len(work) + sum(n or 1 for *_, n in vendor_work), f"{op} (Triton)")
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
    return WarmupSummary([per_op[op] for op in per_op], compiled, time.perf_counter() - start, triton_cache_dir(),
                         str(plat))


@contextlib.contextmanager
def _compile_phase(workers: int | None, load: bool):
    """Triton launches compile without running, on a thread pool (Triton's async compile mode,
    where this Triton has it); every compile has finished on exit, and with ``load`` every kernel
    is loaded onto the current GPU."""
    from concurrent.futures import ThreadPoolExecutor

    try:
        from triton.runtime._async_compile import AsyncCompileMode
    except ImportError:
        AsyncCompileMode = None
    workers = workers or min(8, os.cpu_count() or 1)
    kernels: list = []
    with _compile_without_launching(kernels):
        if AsyncCompileMode is None or workers <= 1:
            yield
        else:
            with ThreadPoolExecutor(workers) as pool, AsyncCompileMode(pool):
                yield
    if load:
        _load(kernels)
