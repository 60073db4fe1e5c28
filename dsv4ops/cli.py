"""``dsv4ops info`` and ``dsv4ops check``."""
from __future__ import annotations

import argparse
import datetime
import sys

from . import OP_NAMES, backends, decide, platform
from ._table import render_table
from .platform import default_device


def cmd_info(args) -> int:
    from .conformance import typical_case
    from .ops import OPS

    device = default_device()
    plat = platform(device)
    print(f"platform: {plat}")
    for module, version in plat.libraries:
        print(f"  {module}: {version}")
    print()
    rows = [(b.name, "yes" if b.available else "no", ",".join(b.platforms), ",".join(b.ops) or "-", b.reason or "")
            for b in backends()]
    print(render_table(("backend", "available", "platforms", "ops", "why not"), rows))
    print()
    for op in OP_NAMES:
        case = typical_case(op)
        decision = decide(OPS[op].validate(**case.build(device, seed=0)))
        print(f"{op} (typical V4 input {case.id}):")
        print("  " + str(decision).replace("\n", "\n  "))
        print()
    return 0


def cmd_check(args) -> int:
    from .conformance import result_rows, select_cases, summarize, to_json

    device = args.device or default_device()
    ops = args.ops.split(",") if args.ops else list(OP_NAMES)
    unknown = [o for o in ops if o not in OP_NAMES]
    if unknown:
        print(f"unknown op(s): {', '.join(unknown)}; ops are {', '.join(OP_NAMES)}", file=sys.stderr)
        return 2
    names = args.backends.split(",") if args.backends else [b.name for b in backends() if b.name != "reference"]
    if not args.backends and "reference" not in names:
        names = ["reference"] + names if args.include_reference else names
    case_list = select_cases(ops, args.tier, args.case)
    if not case_list:
        print("no case matches", file=sys.stderr)
        return 2
    results = _run_with_progress(case_list, names, device, args.seed)
    cells = summarize(result_rows(results))
    plat = platform(device)
    rows = [(name, *(cells.get((name, op)).text if (name, op) in cells else "-" for op in ops)) for name in names]
    print(f"conformance, tier {args.tier}, on {plat} ('-': the backend does not implement the op)")
    print(render_table(("backend", *ops), rows))
    failures = [r for r in results if r.status in ("fail", "error")]
    for r in failures:
        print(f"\n{r.status.upper()} {r.backend} {r.case.id}\n  {r.message}\n  rerun: {r.reproducer()}")
    if args.json:
        meta = dict(date=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
                    platform=str(plat), device=plat.device_name, tier=args.tier, seed=args.seed,
                    libraries=dict(plat.libraries), command=" ".join(["dsv4ops"] + sys.argv[1:]))
        with open(args.json, "w") as f:
            f.write(to_json(results, meta))
    print(f"\n{sum(r.status == 'pass' for r in results)} passed, {len(failures)} failed, "
          f"{sum(r.status == 'skip' for r in results)} skipped")
    return 1 if failures else 0


def _run_with_progress(case_list, names, device, seed):
    from .conformance import run_matrix

    total = len(case_list) * len(names)
    try:
        from rich.progress import Progress
    except ImportError:
        return run_matrix(case_list, names, device, seed)
    with Progress(transient=True) as progress:
        task = progress.add_task("checking", total=total)
        return run_matrix(case_list, names, device, seed,
                          progress=lambda r: progress.update(task, advance=1, description=f"{r.backend} {r.case.op}"))


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="dsv4ops", description="DeepSeek-V4 attention ops across vendor backends")
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("info", help="platform, backends, and what each op dispatches to").set_defaults(fn=cmd_info)
    check = sub.add_parser("check", help="conformance of every available backend against the reference")
    check.add_argument("--ops", help="comma-separated ops (default: all)")
    check.add_argument("--backends", help="comma-separated backends (default: every registered one but reference)")
    check.add_argument("--tier", choices=("quick", "full"), default="quick")
    check.add_argument("--case", help="run only the case with this id (see a failure's rerun line)")
    check.add_argument("--seed", type=int, default=0)
    check.add_argument("--device", help="torch device (default: the accelerator if any, else cpu)")
    check.add_argument("--json", help="write every result to this JSON file")
    check.add_argument("--include-reference", action="store_true", help="also check the reference against itself")
    check.set_defaults(fn=cmd_check)
    bench = sub.add_parser("bench", help="time every available backend side by side (GPU)")
    bench.add_argument("--ops", help="comma-separated ops (default: all)")
    bench.add_argument("--backends", help="comma-separated backends (default: every registered one but reference)")
    bench.add_argument("--shapes", choices=("production", "sweep"), default="production")
    bench.add_argument("--json", help="write the timings to this JSON file")
    bench.add_argument("--plot", metavar="PREFIX", help="write PREFIX<op>.png per op")
    bench.add_argument("--tiny", action="store_true", help="one tiny case (a smoke run on the CPU)")
    bench.add_argument("--overhead", action="store_true", help="only the dispatch overhead (GPU)")
    bench.set_defaults(fn=lambda a: __import__("dsv4ops.bench", fromlist=["main"]).main(a))
    args = parser.parse_args(argv)
    return args.fn(args)


if __name__ == "__main__":
    sys.exit(main())
