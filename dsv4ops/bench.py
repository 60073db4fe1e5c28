"""``dsv4ops bench``: time every available backend per op, side by side, on production shapes.

Per case: the inputs are checked against the reference with the conformance rules first; then
``R`` input sets (enough to exceed twice the L2 cache, so memory-bound kernels are not timed out of
L2) are called back to back inside one CUDA graph, and ``triton.testing.do_bench`` takes the
median of its replays (CUDA events); the time per call is that over ``R``. A backend whose call
cannot be captured is timed eagerly and marked so. Each result carries the byte and flop model
of the op's spec (``bench.cost``), the achieved GB/s and TFLOP/s, their fractions of the device's copy bandwidth
and matrix rate (measured in the same run), and the ratio to the fastest backend of the case.
"""
from __future__ import annotations

import contextlib
import json
import math
import os
import subprocess
import sys
import tempfile
import time
import timeit
from dataclasses import asdict, dataclass

import torch

from . import ops, registry
from .conformance.cases import Case, make_case
from .conformance.runner import run_reference
from .cost import nbytes
from .platform import VENDORS
from .selection import decide
from .tensors import clone_kwargs

# ---------------------------------------------------------------------------------------------
# Shapes (docs/ops.md §0) and the cost model


def production_cases() -> list[Case]:
    """Each op's production shapes (its spec's ``bench.production``)."""
    return [make_case(op.name, "full", **p) for op in ops.OPS.values() for p in op.spec.bench.production]


def step_cases(T: int = 64, H: int = 64, context: int = 4096) -> list[Case]:
    """The calls of one C4 decode step as ``dsv4ops.examples.decode_step`` makes them (``T`` requests
    of one token, ``H`` heads, ``context`` tokens: a quarter of them compressed entries the indexer
    scores), so that ``dsv4ops tune --shapes step`` measures exactly the step's shape buckets."""
    c = lambda op, **kw: make_case(op, "full", **kw)
    compressed = context // 4
    return [
        c("qnorm_rope_kv_insert", T=T, H=H, layout="fp8_ds_mla", block_size=64, num_blocks=8),
        c("paged_mqa_logits", B=T, next_n=1, context=compressed, H=64, block_size=64),
        c("indexer_topk", R=T, W=compressed, k=512, mode="decode2d"),
        c("sparse_mla_decode", T=T, H=H, topk=128, layout="fp8_ds_mla", extra_topk=512, extra_block_size=64,
          lens="full", need_lse=False),
        c("inv_rope_fp8_quant", T=T, H=H, n_groups=H // 8),
        c("fp8_einsum", B=T, H=H // 8, D=1024, R=4096),
    ]


def sweep_cases() -> list[Case]:
    """Each op's sweep shapes (its spec's ``bench.sweep``)."""
    return [make_case(op.name, "full", **p) for op in ops.OPS.values() for p in op.spec.bench.sweep]


SHAPE_SETS = {"production": production_cases, "sweep": sweep_cases, "step": step_cases}


def shape_cases(names: list[str]) -> list[Case]:
    """The cases of the named shape sets, in order."""
    return [case for name in names for case in SHAPE_SETS[name]()]


def cost(op: str, kw: dict) -> tuple[int, int]:
    """(bytes, flops) a kernel must move / do at least (the op's spec's ``bench.cost``)."""
    return ops.OPS[op].spec.bench.cost(kw)


# ---------------------------------------------------------------------------------------------
# Device ceilings

@dataclass
class Ceilings:
    copy_gbps: float        # device-to-device copy, bytes read + written
    bf16_tflops: float      # 8192^3 bf16 matmul
    fp8_tflops: float       # 8192^3 fp8 matmul (torch._scaled_mm), 0 if unavailable


def _copy_gbps(device, nbytes: int = 1 << 30) -> float:
    import triton.testing

    src = torch.empty(nbytes, dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    ms = triton.testing.do_bench(lambda: dst.copy_(src), warmup=10, rep=100, return_mode="median")
    return 2 * nbytes / ms / 1e6


def measure_ceilings(device) -> Ceilings:
    import triton.testing

    copy = _copy_gbps(device)
    n = 8192
    a = torch.randn(n, n, device=device, dtype=torch.bfloat16)
    b = torch.randn(n, n, device=device, dtype=torch.bfloat16)
    ms = triton.testing.do_bench(lambda: a @ b, warmup=10, rep=100, return_mode="median")
    bf16 = 2 * n ** 3 / ms / 1e9
    fp8 = 0.0
    try:
        a8, b8 = a.to(torch.float8_e4m3fn), b.to(torch.float8_e4m3fn).t()
        one = torch.ones((), device=device)
        ms = triton.testing.do_bench(lambda: torch._scaled_mm(a8, b8, one, one, out_dtype=torch.bfloat16),
                                     warmup=10, rep=100, return_mode="median")
        fp8 = 2 * n ** 3 / ms / 1e9
    except Exception:
        pass
    return Ceilings(copy, bf16, fp8)


# ---------------------------------------------------------------------------------------------
# Timing

@dataclass
class Timing:
    op: str
    case: str
    backend: str
    us: float | None = None
    gbps: float | None = None
    tflops: float | None = None
    bandwidth_fraction: float | None = None
    compute_fraction: float | None = None
    vs_fastest: float | None = None
    mode: str = ""                 # "graph" or "eager"
    workspace_mib: float | None = None   # device memory one call allocates beyond its inputs (peak, CUDA)
    note: str = ""


def _input_sets(case: Case, device, l2_bytes: int, budget: int) -> list[dict]:
    first = case.build(device, seed=0)
    per_set = max(1, nbytes(*first.values()))
    n = max(1, min(16, math.ceil(2 * l2_bytes / per_set), budget // per_set))
    return [first] + [case.build(device, seed=i) for i in range(1, n)]


def time_calls(fn, sets: list) -> tuple[float, str]:
    """Median µs per call over the rotating sets: one CUDA graph of len(sets) calls if possible."""
    import triton.testing

    def all_sets():
        for kw in sets:
            fn(kw)
    all_sets()
    torch.cuda.synchronize()
    try:
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            all_sets()
        ms = triton.testing.do_bench(graph.replay, warmup=25, rep=200, return_mode="median")
        return ms * 1000 / len(sets), "graph"
    except Exception:
        torch.cuda.synchronize()
        ms = triton.testing.do_bench(all_sets, warmup=25, rep=200, return_mode="median")
        return ms * 1000 / len(sets), "eager"


def bench(case_list: list[Case], backend_names: list[str], device, ceilings: Ceilings | None,
          progress=print) -> list[Timing]:
    l2 = torch.cuda.get_device_properties(device).L2_cache_size if torch.device(device).type == "cuda" else 1 << 20
    rows: list[Timing] = []
    for case in case_list:
        sets = _input_sets(case, device, l2, budget=8 << 30)
        op = ops.OPS[case.op]
        nbytes, flops = cost(case.op, sets[0])
        ref_kwargs = clone_kwargs(sets[0])
        ref = run_reference(case.op, ref_kwargs)
        typed_sets = [op.validate_call(**kw).args for kw in sets]
        case_rows = []
        for name in backend_names:
            backend = registry.get_backend(name)
            if backend is None or case.op not in backend.implementations:
                continue
            decision = decide(op.validate_call(**sets[0]), name)
            if decision.selected is None:
                why = next((c.status for c in decision.candidates if c.backend == name), "not registered")
                case_rows.append(Timing(case.op, case.id, name, note=f"skipped: {why}"))
                continue
            fn = decision.selected.bound(decision.platform)
            got_kwargs = clone_kwargs(sets[0])
            got = fn(op.validate_call(**got_kwargs).args)
            verdict = op.spec.conformance.compare(case.kwargs, ref_kwargs, ref, got_kwargs, got)
            if not verdict.ok:
                case_rows.append(Timing(case.op, case.id, name, note=f"wrong result: {verdict.message}"))
                continue
            on_gpu = torch.device(device).type == "cuda"
            us, mode = time_calls(fn, typed_sets) if on_gpu else (_cpu_time(fn, typed_sets), "cpu")
            t = Timing(case.op, case.id, name, us=us, mode=mode, gbps=nbytes / us / 1e3,
                       tflops=flops / us / 1e6 if flops else None,
                       workspace_mib=_workspace_mib(fn, typed_sets[0], device) if on_gpu else None)
            if ceilings:
                t.bandwidth_fraction = t.gbps / ceilings.copy_gbps
                rate = ceilings.fp8_tflops if op.spec.bench.matrix == "fp8" else ceilings.bf16_tflops
                t.compute_fraction = t.tflops / rate if (t.tflops and rate) else None
            case_rows.append(t)
        timed = [t.us for t in case_rows if t.us]
        for t in case_rows:
            if t.us:
                t.vs_fastest = min(timed) / t.us
            progress(_line(t))
        rows += case_rows
    return rows


def _workspace_mib(fn, args, device) -> float:
    """MiB that one eager call allocates at its peak beyond what was allocated before it (its
    outputs and temporaries: a logits buffer, a gathered workspace)."""
    torch.cuda.synchronize(device)
    torch.cuda.reset_peak_memory_stats(device)
    before = torch.cuda.memory_allocated(device)
    fn(args)
    torch.cuda.synchronize(device)
    return (torch.cuda.max_memory_allocated(device) - before) / 2 ** 20


def _cpu_time(fn, sets) -> float:
    start = time.perf_counter()
    for args in sets:
        fn(args)
    return (time.perf_counter() - start) * 1e6 / len(sets)


def _line(t: Timing) -> str:
    if t.us is None:
        return f"{t.case:95s} {t.backend:10s} {t.note}"
    frac = f" {100 * t.bandwidth_fraction:5.1f}% bw" if t.bandwidth_fraction is not None else ""
    tf = f" {t.tflops:7.1f} TFLOP/s" if t.tflops else ""
    tf += f" {t.workspace_mib:8.1f} MiB" if t.workspace_mib is not None else ""
    return f"{t.case:95s} {t.backend:10s} {t.us:9.1f} us {t.gbps:8.1f} GB/s{tf}{frac} x{t.vs_fastest:.2f} [{t.mode}]"


# ---------------------------------------------------------------------------------------------
# Dispatch overhead

def _best_of(fns, device, calls: int, rounds: int) -> list[float]:
    """Host µs per call of each of ``fns``, timed in alternation ``rounds`` times ``calls`` calls with
    ``timeit`` (garbage collection off, as for any Python micro-benchmark); the best round counts
    (host noise only ever adds time)."""
    best = [float("inf")] * len(fns)
    for _ in range(rounds):
        for i, fn in enumerate(fns):
            fn()
            _sync(device)
            seconds = timeit.Timer(fn).timeit(calls)
            best[i] = min(best[i], seconds * 1e6 / calls)
            _sync(device)
    return best


_NULL = "overhead-probe"


def _nothing(args):
    return None


@contextlib.contextmanager
def _null_backend():
    """A temporary backend whose implementations return at once: a call through it costs exactly
    dsv4ops' own work (argument binding, structure key, lookup, device binding)."""
    backend = registry.register_backend(registry.Backend(_NULL, VENDORS, description="bench: does nothing"))
    for op in ops.OPS:
        backend.implements(op, _nothing, priority=-1)
    try:
        yield _NULL
    finally:
        registry.unregister_backend(_NULL)


def dispatch_overhead(device, calls: int = 1000, rounds: int = 7, layer_rounds: int = 25) -> dict[str, dict]:
    """Per op (tiny shapes, so the host is the bottleneck), host µs per call of:

    - ``layer_us``: what dsv4ops adds to a call — ``dsv4ops.<op>(...)`` routed to an implementation
      that does nothing, minus that implementation called directly. Free of kernel-launch noise;
      this is the number the overhead target is about. Best of ``layer_rounds`` short rounds
      (2 x ``calls`` calls, a few ms each): on a shared host a short round is likelier to run undisturbed.
    - ``dsv4ops_us`` / ``prepared_us`` / ``direct_us``: the real selected implementation called
      through ``dsv4ops.<op>``, through a prepared call's ``run``, and directly (launch included;
      their differences carry the launch's run-to-run noise)."""
    from .prepared import prepare

    result = {}
    for op, spec in ((name, o.spec) for name, o in ops.OPS.items()):
        kw = make_case(op, "quick", **spec.bench.tiny).build(device, seed=0)
        call = ops.OPS[op].validate_call(**kw)
        decision = decide(call)
        impl, direct = decision.selected, decision.selected.bound(decision.platform)
        public = ops.OPS[op].function
        prepared = prepare(op, **kw)
        tensors = {k: v for k, v in kw.items() if isinstance(v, torch.Tensor)}    # what an engine passes per step
        real = _best_of((lambda: public(**kw), lambda: prepared.run(**tensors), lambda: direct(call.args)),
                        device, calls, rounds)
        with _null_backend() as null:
            routed, direct = _best_of((lambda: public(**kw, backend=null), lambda: _nothing(call.args)),
                                      device, calls * 2, layer_rounds)
        result[op] = dict(backend=impl.backend.name, layer_us=routed - direct, dsv4ops_us=real[0],
                          prepared_us=real[1], direct_us=real[2])
    return result


def _sync(device):
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize()


# ---------------------------------------------------------------------------------------------

def roofline_fraction(t: Timing) -> float | None:
    """The roofline's time over the measured time: ``max(bytes / copy bandwidth, flops / matrix
    rate)`` is the fastest the call could run, so the fraction is the larger of the two fractions."""
    fractions = [f for f in (t.bandwidth_fraction, t.compute_fraction) if f is not None]
    return max(fractions) if fractions else None


def plot(rows: list[Timing], prefix: str) -> list[str]:
    """One PNG per op: per backend across the op's cases, µs per call (log scale) and, where the
    device ceilings were measured, the fraction of the roofline reached."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    paths = []
    for op in dict.fromkeys(r.op for r in rows):
        timed = [r for r in rows if r.op == op and r.us]
        if not timed:
            continue
        cases = list(dict.fromkeys(r.case for r in timed))
        backends = list(dict.fromkeys(r.backend for r in timed))
        panels = [("µs per call (median)", lambda r: r.us, "log")]
        if any(roofline_fraction(r) is not None for r in timed):
            panels.append(("fraction of the roofline", roofline_fraction, "linear"))
        fig, axes = plt.subplots(1, len(panels), figsize=(len(panels) * max(6, 1.4 * len(cases)), 4), squeeze=False)
        width = 0.8 / len(backends)
        for ax, (label, value, scale) in zip(axes[0], panels):
            for i, name in enumerate(backends):
                bars = [next((value(r) for r in timed if r.case == c and r.backend == name), None) for c in cases]
                ax.bar([j + i * width for j in range(len(cases))], [float("nan") if v is None else v for v in bars],
                       width, label=name)
            ax.set_xticks([j + 0.4 - width / 2 for j in range(len(cases))])
            ax.set_xticklabels([c[len(op) + 1:-1].replace(",", "\n") for c in cases], fontsize=6)
            ax.set_yscale(scale)
            ax.set_ylabel(label)
            ax.set_title(op)
            ax.legend()
        fig.tight_layout()
        path = f"{prefix}{op}.png"
        fig.savefig(path, dpi=120)
        plt.close(fig)
        paths.append(path)
    return paths


# ---------------------------------------------------------------------------------------------
# First calls (--cold): each op's first call in a fresh process and Triton cache, with and without
# dsv4ops.warmup before it

def cold_params(op: str, index_topk: int) -> dict:
    """The op's typical call (its conformance ``typical``), selecting the model's index top-k."""
    params = dict(ops.OPS[op].spec.conformance.typical)
    for name in ("k", "topk"):
        if name in params and op in ("indexer_topk", "mqa_topk", "paged_mqa_topk"):
            params[name] = index_topk
    return params


def first_calls(op_names: list[str], backend_names: list[str], warm: bool) -> dict:
    """In this process: ``dsv4ops.warmup`` (if ``warm``; V4-Flash TP1, default limits), then per op
    the first and second call's time (ms) of its typical call through dispatch."""
    import dsv4ops

    from .deployment import model_dims

    device = torch.device("cuda", torch.cuda.current_device())
    result = dict(warmup_s=None, ops={})
    if warm:
        start = time.perf_counter()
        dsv4ops.warmup(op_names, backends=backend_names, device=device)
        result["warmup_s"] = time.perf_counter() - start
    gen = torch.Generator().manual_seed(0)
    for op in op_names:
        kwargs = ops.OPS[op].spec.conformance.inputs(device, gen, **cold_params(op, model_dims().index_topk))
        times = []
        for _ in range(2):
            torch.cuda.synchronize(device)
            start = time.perf_counter()
            ops.OPS[op].function(**kwargs)
            torch.cuda.synchronize(device)
            times.append((time.perf_counter() - start) * 1e3)
        result["ops"][op] = dict(first_ms=times[0], second_ms=times[1],
                                 backend=decide(ops.OPS[op].validate_call(**kwargs)).backend)
    return result


def cold(args) -> int:
    """``bench --cold``: two fresh processes, each with an empty TRITON_CACHE_DIR: one calls each op
    cold, the other after ``dsv4ops.warmup``; prints both first calls and the warm-up's duration."""
    runs = {}
    for warm in (False, True):
        with tempfile.TemporaryDirectory(prefix="dsv4ops-cold-") as cache:
            env = dict(os.environ, TRITON_CACHE_DIR=cache)
            env.pop("TRITON_INTERPRET", None)
            child = subprocess.run([sys.executable, "-m", "dsv4ops.bench", "--first-calls", json.dumps(
                dict(ops=args.ops, backends=args.backends, warm=warm))], capture_output=True, text=True, env=env)
        if child.returncode != 0:
            print(f"dsv4ops bench --cold: the {'warm' if warm else 'cold'} run failed:\n{child.stderr[-3000:]}",
                  file=sys.stderr)
            return 1
        runs[warm] = json.loads(child.stdout.strip().splitlines()[-1])
    from ._table import render_table

    rows = [(op, runs[False]["ops"][op]["backend"] or "-", f"{runs[False]['ops'][op]['first_ms']:.1f}",
             f"{runs[True]['ops'][op]['first_ms']:.1f}", f"{runs[True]['ops'][op]['second_ms']:.2f}") for op in args.ops]
    print(render_table(("op", "backend", "first call, cold (ms)", "first call after warm-up (ms)", "second call (ms)"),
                       rows))
    print(f"warm-up (V4-Flash TP1, default limits, empty cache): {runs[True]['warmup_s']:.1f} s")
    if args.json:
        with args.json as f:
            json.dump(dict(cold=runs[False], warm=runs[True]), f, indent=1)
    return 0


def main(args) -> int:
    """``dsv4ops bench``: ``args.ops`` and ``args.backends`` are lists and ``args.json`` an open file
    (or None), checked by cli.py before anything runs."""
    from .platform import default_device, platform

    device = default_device()
    names = args.backends
    if args.cold:
        if device.type != "cuda":
            print(f"dsv4ops bench --cold: first calls time kernel compiles, which happen on a GPU; there is no "
                  f"CUDA device here ({device}) and the Triton interpreter compiles nothing. Run it on a GPU.",
                  file=sys.stderr)
            return 2
        return cold(args)
    if device.type != "cuda" and not args.tiny and not args.overhead:
        print(f"dsv4ops bench: the {','.join(args.shapes)} shapes are GPU-sized and there is no CUDA device here "
              f"({device}); through the reference and the Triton interpreter they would run for hours. "
              f"Use --tiny for a smoke run on this machine, or run on a GPU.", file=sys.stderr)
        return 2
    if args.tiny:
        case_list = [make_case(op.name, "quick", **op.spec.bench.tiny) for op in ops.OPS.values()]
    else:
        case_list = shape_cases(args.shapes)
    case_list = [c for c in case_list if c.op in args.ops]
    on_gpu = device.type == "cuda"
    if args.overhead:
        case_list = []
    ceilings = measure_ceilings(device) if on_gpu and case_list else None
    if ceilings:
        print(f"ceilings: copy {ceilings.copy_gbps:.0f} GB/s, bf16 {ceilings.bf16_tflops:.0f} TFLOP/s, "
              f"fp8 {ceilings.fp8_tflops:.0f} TFLOP/s")
    rows = bench(case_list, names, device, ceilings)
    overhead = dispatch_overhead(device) if on_gpu and args.overhead else {}
    for op, o in overhead.items():
        print(f"dispatch overhead {op:22s} added by dsv4ops {o['layer_us']:5.2f} us | with {o['backend']}: "
              f"dsv4ops {o['dsv4ops_us']:6.1f} us, prepared {o['prepared_us']:6.1f} us, direct {o['direct_us']:6.1f} us")
    plat = platform(device)
    if args.json:
        with args.json as f:
            json.dump(dict(platform=str(plat), libraries=dict(plat.libraries), shapes=args.shapes,
                           ceilings=asdict(ceilings) if ceilings else None, results=[asdict(r) for r in rows],
                           dispatch_overhead=overhead), f, indent=1)
    if args.plot:
        for path in plot(rows, args.plot):
            print(f"wrote {path}")
    if not overhead and not any(r.us for r in rows):
        print(f"nothing was timed: no case of {', '.join(args.ops)} ran on {', '.join(names)} here", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__" and sys.argv[1:2] == ["--first-calls"]:
    _request = json.loads(sys.argv[2])
    print(json.dumps(first_calls(_request["ops"], _request["backends"], _request["warm"])))
