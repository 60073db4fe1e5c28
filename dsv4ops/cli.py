"""``dsv4ops info``, ``dsv4ops check``, ``dsv4ops bench``, ``dsv4ops tune`` and ``dsv4ops warmup``.

Every flag is checked, and output files are opened, before anything runs; a bad flag, path or
``DSV4OPS_*`` variable is one line on stderr and exit status 2, never a traceback.
"""
from __future__ import annotations

import argparse
import collections
import datetime
import importlib.util
import json
import os
import sys
import textwrap
import time
import warnings

import torch

from . import OP_NAMES, __version__, backends, decide, platform, registry
from ._table import render_table
from .errors import Dsv4opsError
from .platform import default_device


class UsageError(Exception):
    """A bad command-line flag or output path (reported in one line, exit status 2)."""


def parse_ops(value: str | None) -> list[str]:
    """``--ops a,b`` -> the ops (default: all)."""
    ops = [o.strip() for o in value.split(",")] if value else list(OP_NAMES)
    unknown = [o for o in ops if o not in OP_NAMES]
    if unknown:
        raise UsageError(f"--ops: unknown op(s) {', '.join(map(repr, unknown))}; ops are {', '.join(OP_NAMES)}")
    return ops


def parse_shapes(value: str) -> list[str]:
    """``--shapes a,b`` -> shape set names (``all``: every set)."""
    from .bench import SHAPE_SETS

    names = list(SHAPE_SETS) if value == "all" else [s.strip() for s in value.split(",")]
    unknown = [s for s in names if s not in SHAPE_SETS]
    if unknown:
        raise UsageError(f"--shapes: unknown set(s) {', '.join(map(repr, unknown))}; sets are "
                         f"{', '.join(SHAPE_SETS)} or all")
    return names


def parse_backends(value: str | None) -> list[str]:
    """``--backends a,b`` -> registered backend names (default: every registered one but reference)."""
    known = registry.backend_names()
    if not value:
        return [name for name in known if name != "reference"]
    names = [n.strip() for n in value.split(",")]
    unknown = [n for n in names if n not in known]
    if unknown:
        raise UsageError(f"--backends: unknown backend(s) {', '.join(map(repr, unknown))}; backends are "
                         f"{', '.join(known)}")
    return names


def parse_device(value: str | None) -> torch.device:
    """``--device`` -> a torch device that exists here (default: the current accelerator, else cpu)."""
    if not value:
        return default_device()
    try:
        device = torch.device(value)
    except RuntimeError:
        raise UsageError(f"--device {value!r}: not a torch device (e.g. cpu, cuda, cuda:1)") from None
    if device.type != "cpu":
        module = getattr(torch, device.type, None)
        count = module.device_count() if module is not None and module.is_available() else 0
        if count == 0 or (device.index or 0) >= count:
            raise UsageError(f"--device {value!r}: no such device here ({count} {device.type} device(s) visible)")
    return device


def open_output(value: str | None, flag: str):
    """Open an output file for writing now, so that a bad path fails before the run (None if unset)."""
    if not value:
        return None
    try:
        return open(value, "w")
    except OSError as exc:
        raise UsageError(f"{flag} {value!r}: cannot write ({exc.strerror or exc})") from None


def check_plot_prefix(value: str | None) -> None:
    """``bench --plot PREFIX``: matplotlib installed and PREFIX's folder writable."""
    if not value:
        return
    if importlib.util.find_spec("matplotlib") is None:
        raise UsageError('--plot needs matplotlib: pip install "dsv4ops[bench]"')
    folder = os.path.dirname(value) or "."
    if not os.path.isdir(folder) or not os.access(folder, os.W_OK):
        raise UsageError(f"--plot {value!r}: folder {folder!r} does not exist or is not writable")


INFO_WIDTH = 120


def _fit(text: str, verbose: bool) -> str:
    """``text`` in lines of at most INFO_WIDTH columns: cut with '…' (wrapped whole with --verbose)."""
    if len(text) <= INFO_WIDTH:
        return text
    if verbose:
        indent = " " * (len(text) - len(text.lstrip()) + 4)
        return "\n".join(textwrap.wrap(text, INFO_WIDTH, subsequent_indent=indent, break_on_hyphens=False))
    return text[:INFO_WIDTH - 1] + "…"


def cmd_info(args) -> int:
    from .conformance import typical_case
    from .ops import OPS
    from .vendor_wheels import install_hint

    device = default_device()
    plat = platform(device)
    print(f"dsv4ops {__version__}")
    print(f"platform: {plat}")
    for module, version in plat.libraries:
        print(f"  {module}: {version}")
    print(textwrap.fill(f"FlashMLA / DeepGEMM wheels {install_hint()}", INFO_WIDTH, subsequent_indent="    ",
                        break_on_hyphens=False))
    from .integrations.vllm import status as vllm_plugin_status
    print(vllm_plugin_status())
    print()
    infos, rows = backends(), []
    for b in infos:
        ops = textwrap.wrap(f"all {len(OP_NAMES)}" if len(b.ops) == len(OP_NAMES) else ", ".join(b.ops), 44) or ["-"]
        rows += [(b.name, "yes" if b.available else "no", ",".join(b.platforms), ops[0])]
        rows += [("", "", "", more) for more in ops[1:]]
    print(render_table(("backend", "available", "platforms", "ops"), rows))
    for b in infos:
        if args.verbose:
            print(_fit(f"  {b.name}: {b.description}", True))
        if b.reason:
            print(_fit(f"  {b.name} unavailable: {b.reason}", True))     # ends in what to install: never cut
    print()
    unserved = []
    for op in OP_NAMES:
        case = typical_case(op)
        decision = decide(OPS[op].validate_call(**case.build(device, seed=0)))
        print(textwrap.fill(f"{op} (typical V4 input {case.id}):", INFO_WIDTH, subsequent_indent="    "))
        for line in str(decision).splitlines():
            print(_fit("  " + line, args.verbose))
        print()
        if decision.selected is None:
            unserved.append(op)
    if not unserved:
        print(f"every op has an implementation here ({len(OP_NAMES)} of {len(OP_NAMES)})")
        return 0
    print(textwrap.fill(f"no implementation serves {len(unserved)} of {len(OP_NAMES)} ops here: {', '.join(unserved)} "
                        f"(the reasons above; a DSV4OPS_BACKEND pin?)", INFO_WIDTH), file=sys.stderr)
    return 1 if args.check else 0


CHECK_WIDTH = 120


def cmd_check(args) -> int:
    from .backend_support import interpreter_on_cpu
    from .conformance import LEGEND, result_rows, select_cases, summarize, to_json, unavailable_backends
    from .conformance.versions import run_meta, verified_pairs

    device = parse_device(args.device)
    ops, names = parse_ops(args.ops), parse_backends(args.backends)
    if not 0 <= args.seed < 2 ** 62:                 # case i uses seed + i, a torch.Generator seed
        raise UsageError(f"--seed {args.seed}: expected an integer in [0, 2**62)")
    if args.repeat < 1:
        raise UsageError(f"--repeat {args.repeat}: expected an integer >= 1")
    if args.include_reference and "reference" not in names:
        names = ["reference"] + names
    case_list = select_cases(ops, args.tier, args.case)
    if not case_list:
        raise UsageError("no case matches" + (f" --case {args.case!r}" if args.case else ""))
    if args.tier == "full" and device.type == "cpu" and not args.allow_cpu_full:
        raise UsageError("--tier full: the production shapes are GPU-sized; through the reference and the Triton "
                         "interpreter on a CPU they would run for hours. Run it on a GPU, or pass --allow-cpu-full")
    json_file = open_output(args.json, "--json")
    if not args.no_interpreter:
        interpreter_on_cpu(device, "dsv4ops check")
    unavailable = unavailable_backends(names, device)
    names = [n for n in names if n not in unavailable]
    start = time.perf_counter()
    results = _run_with_progress(case_list, names, device, args.seed, args.repeat)
    seconds = time.perf_counter() - start
    cells = summarize(result_rows(results))
    plat = platform(device)
    print(f"conformance, tier {args.tier}, on {plat}: {len(case_list)} cases in {seconds:.0f} s")
    for table in _matrix_tables(cells, names, ops):
        print(table)
    print(textwrap.fill(LEGEND, CHECK_WIDTH))
    for name, reason in unavailable.items():
        print("  " + textwrap.shorten(f"not run: {name}: {reason}", CHECK_WIDTH - 2))
    declined = {(n, op): c.reason for (n, op), c in sorted(cells.items()) if c.text == "declined"}
    for (name, op), reason in declined.items():
        print("  " + textwrap.shorten(f"declined {name} {op}: {reason}", CHECK_WIDTH - 2))
    if args.repeat > 1:
        print(textwrap.fill(f"--repeat {args.repeat}: every passing case was launched {args.repeat} times"
                            + (" and replayed from a CUDA graph" if device.type == "cuda" else "")
                            + "; each launch's results and written arguments were compared bit for bit with the "
                              "first's (a difference fails the case)", CHECK_WIDTH))
    failures = [r for r in results if r.status in ("fail", "error")]
    for r in failures:
        print(f"\n{r.status.upper()} {r.backend} {r.case.id}\n  {r.message}\n  rerun: {r.reproducer()}")
    if json_file:
        meta = dict(date=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
                    platform=str(plat), device=plat.device_name, tier=args.tier, seed=args.seed,
                    libraries=dict(plat.libraries), command=" ".join(["dsv4ops"] + sys.argv[1:]),
                    **run_meta(verified_pairs(result_rows(results))))
        with json_file:
            json_file.write(to_json(results, meta))
    passed = sum(r.status == "pass" for r in results)
    print(f"\n{passed} passed, {len(failures)} failed, {sum(r.status == 'skip' for r in results)} declined "
          f"(cases an implementing backend cannot serve here)")
    if failures:
        return 1
    if not passed:
        print("nothing was checked: no selected backend could run any case here", file=sys.stderr)
        return 1
    return 0


def _matrix_tables(cells, names, ops) -> list[str]:
    """The result matrix, ops as rows and backends as columns, split into as many tables (each
    with the op column) as keep every line within CHECK_WIDTH columns."""
    table = lambda group: render_table(("op", *group), [(op, *(cells[(n, op)].text if (n, op) in cells else "-"
                                                               for n in group)) for op in ops])
    tables, group = [], []
    for name in names:
        if group and max(map(len, table(group + [name]).splitlines())) > CHECK_WIDTH:
            tables.append(table(group))
            group = []
        group.append(name)
    return tables + [table(group)]


def _run_with_progress(case_list, names, device, seed, repeat):
    """run_matrix with a progress bar on a terminal, else a line on stderr per op checked (CI logs)."""
    from .conformance import run_matrix

    if sys.stderr.isatty():
        try:
            from rich.progress import Progress
        except ImportError:
            pass
        else:
            with Progress(transient=True) as progress:
                task = progress.add_task("checking", total=len(case_list) * len(names))
                return run_matrix(case_list, names, device, seed, repeat=repeat, progress=lambda r: progress.update(
                    task, advance=1, description=f"{r.backend} {r.case.op}"))
    lines = _ProgressLines()
    results = run_matrix(case_list, names, device, seed, repeat=repeat, progress=lines)
    lines.flush()
    return results


class _ProgressLines:
    """One line on stderr per op checked: the progress of a run whose stderr is no terminal (CI
    logs, ``| tee``). Results arrive op after op."""

    def __init__(self):
        self.op, self.results, self.start = None, [], time.perf_counter()

    def __call__(self, result) -> None:
        if result.case.op != self.op:
            self.flush()
        self.op = result.case.op
        self.results.append(result)

    def flush(self) -> None:
        if self.results:
            counts = collections.Counter(r.status for r in self.results)
            print(f"checked {self.op}: {counts['pass']} passed, {counts['fail'] + counts['error']} failed, "
                  f"{counts['skip']} declined ({time.perf_counter() - self.start:.0f} s so far)", file=sys.stderr,
                  flush=True)
        self.results = []


def cmd_bench(args) -> int:
    from . import bench
    from .backend_support import interpreter_on_cpu

    args.ops, args.backends = parse_ops(args.ops), parse_backends(args.backends)
    args.shapes = parse_shapes(args.shapes)
    check_plot_prefix(args.plot)
    args.json = open_output(args.json, "--json")
    if args.tiny:
        interpreter_on_cpu(default_device(), "dsv4ops bench")
    return bench.main(args)


def cmd_tune(args) -> int:
    from . import tune

    args.ops, args.backends = parse_ops(args.ops), parse_backends(args.backends)
    args.shapes = parse_shapes(args.shapes)
    if args.from_bench:
        try:
            with open(args.from_bench) as f:
                args.from_bench = json.load(f)
        except (OSError, ValueError) as exc:
            raise UsageError(f"--from-bench {args.from_bench!r}: cannot read a bench JSON ({exc})") from None
    open_output(args.out, "--out").close()
    return tune.main(args)


def parse_fields(items: list[str] | None, flag: str) -> dict:
    """``--dim heads=32 --dim window=128`` -> {"heads": 32, "window": 128} (integers)."""
    fields = {}
    for item in items or ():
        name, _, value = item.partition("=")
        if not value.strip().isdigit():
            raise UsageError(f"{flag} {item!r}: expected NAME=INTEGER")
        fields[name.strip()] = int(value)
    return fields


def cmd_warmup(args) -> int:
    from .deployment import TOPK_MODES
    from .warm_up import warmup

    ops = parse_ops(args.ops)
    backend_names = parse_backends(args.backends)
    device = parse_device(args.device)
    limits = {name: getattr(args, name) for name in ("max_tokens", "max_context", "next_n", "swa_block", "c4_block",
                                                    "c128_block") if getattr(args, name) is not None}
    if args.layouts:
        limits["layouts"] = tuple(x.strip() for x in args.layouts.split(","))
    if args.topk_modes:
        limits["topk_modes"] = tuple(x.strip() for x in args.topk_modes.split(","))
        if not set(limits["topk_modes"]) <= set(TOPK_MODES):
            raise UsageError(f"--topk-modes {args.topk_modes!r}: expected some of {', '.join(TOPK_MODES)}")
    if args.index_layouts:
        limits["index_layouts"] = tuple(x.strip() for x in args.index_layouts.split(","))
    out = open_output(args.json, "--json")
    options = dict(model=args.model, tp=args.tp, dims=parse_fields(args.dim, "--dim"), limits=limits, device=device,
                   backends=backend_names, workers=args.workers)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", "dsv4ops.warmup: ")     # why nothing compiled: the error below
        try:
            from rich.progress import Progress
        except ImportError:
            summary = warmup(ops, **options, progress=lambda done, total, text: print(f"[{done}/{total}] {text}",
                                                                                       file=sys.stderr))
        else:
            with Progress(transient=True) as bar:
                task = bar.add_task("warm-up", total=None)
                summary = warmup(ops, **options, progress=lambda done, total, text: bar.update(
                    task, completed=done, total=total, description=text))
    if summary.reason is not None:
        raise UsageError(summary.reason)
    print(summary)
    if out is not None:
        json.dump(dict(platform=summary.platform, seconds=summary.seconds, cache_dir=summary.cache_dir,
                       variants=sorted(map(list, summary.variants)),
                       ops=[dict(op=o.op, calls=o.calls, compiled=o.compiled, vendor_calls=o.vendor_calls,
                                 backends=sorted(o.backends), seconds=o.seconds, skipped=o.skipped)
                            for o in summary.ops]), out, indent=1)
        out.close()
    return 0


class HelpFormatter(argparse.HelpFormatter):
    """Adds an option's default to its help, unless the help states it already."""

    def _get_help_string(self, action):
        text = action.help or ""
        if "default" in text or any(action.default is unset for unset in (None, False, argparse.SUPPRESS)):
            return text
        return f"{text} (default: %(default)s)"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="dsv4ops", description="DeepSeek-V4 attention ops across vendor backends",
                                     formatter_class=HelpFormatter)
    parser.add_argument("--version", action="version", version=f"dsv4ops {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    command = lambda name, text: sub.add_parser(name, help=text, description=text, formatter_class=HelpFormatter)
    info = command("info", "platform, backends, and what each op dispatches to (lines of at most 120 columns)")
    info.add_argument("--verbose", action="store_true", help="backend descriptions and every reason in full")
    info.add_argument("--check", action="store_true",
                      help="a preflight: exit status 1 when an op has no implementation here (a DSV4OPS_BACKEND pin "
                           "to a backend that cannot serve it, say); 0 otherwise")
    info.set_defaults(fn=cmd_info)

    check = command("check", "conformance of every available backend against the reference")
    check.add_argument("--ops", help="comma-separated ops (default: all)")
    check.add_argument("--backends", help="comma-separated backends (default: every registered one but reference)")
    check.add_argument("--tier", choices=("quick", "full"), default="quick",
                       help="quick: small shapes, CPU-friendly (on a CPU through Triton's interpreter about 2 "
                            "minutes of one core, measured on the 2-core CI-sized machine); full: production "
                            "shapes (GPU; refused on a CPU without --allow-cpu-full)")
    check.add_argument("--case", help="run only the case with this id (see a failure's rerun line)")
    check.add_argument("--seed", type=int, default=0, help="base seed of the random inputs (case i uses seed + i)")
    check.add_argument("--device", help="torch device, e.g. cuda:1 (default: the current accelerator, else cpu)")
    check.add_argument("--json", help="write every result to this JSON file")
    check.add_argument("--include-reference", action="store_true", help="also check the reference against itself")
    check.add_argument("--repeat", type=int, default=1, metavar="N",
                       help="also launch each case N-1 more times and (on CUDA) replay it from a CUDA graph: "
                            "every result must be bitwise identical to the first call's")
    check.add_argument("--no-interpreter", action="store_true",
                       help="on a CPU device, do not run the Triton kernels through TRITON_INTERPRET=1")
    check.add_argument("--allow-cpu-full", action="store_true",
                       help="run --tier full on a CPU device anyway (hours; refused without this flag)")
    check.set_defaults(fn=cmd_check)

    bench = command("bench", "time every available backend side by side")
    bench.add_argument("--ops", help="comma-separated ops (default: all)")
    bench.add_argument("--backends", help="comma-separated backends (default: every registered one but reference)")
    bench.add_argument("--shapes", default="production",
                       help="comma-separated shape sets: production (the V4 serving shapes), sweep (the tuning "
                            "sweeps), step (the calls of one C4 decode step: dsv4ops.examples.decode_step, 64 "
                            "requests, 4K context), or all")
    bench.add_argument("--json", help="write the timings to this JSON file")
    bench.add_argument("--plot", metavar="PREFIX", help="write PREFIX<op>.png per op")
    bench.add_argument("--tiny", action="store_true", help="one tiny case per op (a smoke run, CPU included)")
    bench.add_argument("--overhead", action="store_true", help="only the dispatch overhead (GPU)")
    bench.add_argument("--cold", action="store_true",
                       help="each op's first-call time in a fresh process and Triton cache, without and with "
                            "dsv4ops.warmup before it, and the warm-up's duration (GPU)")
    bench.set_defaults(fn=cmd_bench)

    tune = command("tune", "time every available backend per op and shape bucket here; write the selection "
                           "table dispatch consults (DSV4OPS_TUNING_TABLE)")
    tune.add_argument("--ops", help="comma-separated ops (default: all)")
    tune.add_argument("--backends", help="comma-separated backends (default: every registered one but reference)")
    tune.add_argument("--shapes", default="all",
                      help="comma-separated shape sets to measure: production, sweep, step (see bench --shapes), or all")
    tune.add_argument("--from-bench", metavar="BENCH_JSON",
                      help="build the table from this `dsv4ops bench --json` result (measured on this machine, "
                           "with the libraries installed now) instead of timing again; --shapes is then its set")
    tune.add_argument("--out", required=True, help="the table to write (JSON)")
    tune.set_defaults(fn=cmd_tune)
    warm = command("warmup", "compile every kernel variant the ops can meet within an engine's limits (run once at "
                             "start-up, or once per fleet with TRITON_CACHE_DIR shipped)")
    warm.add_argument("--ops", help="comma-separated ops (default: all)")
    warm.add_argument("--backends", help="comma-separated backends (default: every registered one but reference)")
    warm.add_argument("--model", choices=("v4-flash", "v4-pro"), default="v4-flash", help="the model's dimensions")
    warm.add_argument("--tp", type=int, default=1, choices=(1, 2, 4, 8), help="tensor parallelism (heads per rank)")
    warm.add_argument("--dim", action="append", metavar="NAME=VALUE",
                      help="override a model dimension (heads, o_groups, index_topk, index_heads, window, "
                           "o_lora_rank, o_group_k, v41_index_heads, candidate_block, candidate_blocks); repeatable")
    warm.add_argument("--max-tokens", type=int, help="tokens per step, prefill chunk or decode rows (default 8192)")
    warm.add_argument("--max-context", type=int, help="tokens of one request's context (default 131072)")
    warm.add_argument("--next-n", type=int, help="rows per decode request, 1 + MTP draft tokens (default 1)")
    warm.add_argument("--swa-block", type=int, help="page size of the sliding-window cache (default 64)")
    warm.add_argument("--c4-block", type=int, help="page size of the C4 caches, compressed tokens (default 64)")
    warm.add_argument("--c128-block", type=int, help="page size of the C128 cache, compressed tokens (default 2)")
    warm.add_argument("--layouts", help="comma-separated attention cache layouts (default fp8_ds_mla)")
    warm.add_argument("--topk-modes", help="indexer_topk row modes: ranges, decode1d, decode2d (default all)")
    warm.add_argument("--index-layouts", help="indexer key cache layouts of the two-level ops: index_fp8, "
                                              "index_mxfp4 (default both)")
    warm.add_argument("--device", help="torch device, e.g. cuda:1 (default: the current accelerator)")
    warm.add_argument("--workers", type=int, help="threads compiling Triton variants (default: CPUs, at most 8)")
    warm.add_argument("--json", help="write the summary and every compiled variant to this JSON file")
    warm.set_defaults(fn=cmd_warmup)
    args = parser.parse_args(argv)
    try:
        return args.fn(args)
    except (UsageError, Dsv4opsError) as exc:         # dsv4ops' own errors: bad flags, env, inputs
        print(f"dsv4ops {args.command}: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
