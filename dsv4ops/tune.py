"""``dsv4ops tune``: time every available backend per op and shape bucket on this device and write
the selection table that dispatch consults before the static priorities (``DSV4OPS_TUNING_TABLE``;
format in dsv4ops/tuning_table.py).

Each backend's result is checked against the reference first (a wrong or declining backend is never
chosen); timings are the bench's (CUDA-graph replay over rotating input sets). Cases whose shapes
fall in one bucket keep the backend that was fastest on the most of them. ``--from-bench`` builds the
table from a ``dsv4ops bench --json`` file measured on this machine instead of timing again.
"""
from __future__ import annotations

import collections

from . import ops, tuning_table
from .bench import Timing, bench, shape_cases
from .conformance.cases import Case
from .errors import ConfigError
from .platform import platform


def entries_from(case_list: list[Case], rows: list[Timing], device) -> list[dict]:
    """One table entry per (op, bucket, size class): the backend fastest on the most of its cases."""
    by_case = collections.defaultdict(dict)
    for r in rows:
        if r.us is not None:
            by_case[r.case][r.backend] = r.us
    wins: dict[tuple, collections.Counter] = collections.defaultdict(collections.Counter)
    shown: dict[tuple, dict] = {}
    for case in case_list:
        timings = by_case.get(case.id)
        if not timings:
            continue
        key = ops.OPS[case.op].validate_call(**case.build(device, seed=0)).key
        slot = (case.op, tuning_table.bucket(key), key.size_class)
        wins[slot][min(timings, key=timings.get)] += 1
        shown.setdefault(slot, dict(case=case.id, timings_us={b: round(t, 2) for b, t in timings.items()}))
    return [dict(op=op, bucket=b, size_class=size, choice=wins[(op, b, size)].most_common(1)[0][0],
                 **shown[(op, b, size)]) for (op, b, size) in wins]


def from_bench(data: dict, plat) -> tuple[list[Case], list[Timing]]:
    """The cases and timings of a ``dsv4ops bench --json`` result, if it was measured on ``plat``
    with the libraries installed now (ConfigError otherwise)."""
    if data.get("platform") != str(plat) or data.get("libraries") != dict(plat.libraries):
        raise ConfigError(f"--from-bench: measured on {data.get('platform')} with {data.get('libraries')}, "
                          f"not here ({plat}, {dict(plat.libraries)}): run dsv4ops bench on this machine")
    rows = [Timing(**r) for r in data["results"]]
    timed = {r.case for r in rows}
    return [c for c in shape_cases(data["shapes"]) if c.id in timed], rows


def main(args) -> int:
    """``args``: ops, backends, shapes (parsed lists: shape set names), from_bench (a parsed bench
    JSON or None), out (path)."""
    from .platform import default_device

    device = default_device()
    if device.type == "cpu":
        print("dsv4ops tune: no accelerator here; timings on the CPU (the interpreter) would choose nothing useful")
        return 2
    plat = platform(device)
    if args.from_bench:
        case_list, rows = from_bench(args.from_bench, plat)
        case_list = [c for c in case_list if c.op in args.ops]
        rows = [r for r in rows if r.backend in args.backends]
    else:
        case_list = [c for c in shape_cases(args.shapes) if c.op in args.ops]
        rows = bench(case_list, args.backends, device, None)
    entries = entries_from(case_list, rows, device)
    tuning_table.save(args.out, plat, entries)
    for e in entries:
        print(f"{e['op']:22s} {e['choice']:10s} {e['case']}")
    print(f"wrote {len(entries)} entries for {plat.device_name} to {args.out}; "
          f"use it with DSV4OPS_TUNING_TABLE={args.out}")
    return 0
