"""Conformance suite: every backend against the one reference over the same case matrix."""
from __future__ import annotations

import functools
import json
from dataclasses import dataclass
from typing import Callable, Iterable

from .. import registry
from ..platform import platform
from .cases import TIERS, Case, build_inputs, cases, make_case, typical_case
from .runner import Result, reference_call, run_case


def select_cases(op_names: Iterable[str], tier: str, case_id: str | None = None) -> list[Case]:
    chosen = [c for op in op_names for c in cases(op, tier)]
    if case_id is not None:
        chosen = [c for c in chosen if c.id == case_id]
    return chosen


def unavailable_backends(backend_names: Iterable[str], device) -> dict[str, str]:
    """The backends of ``backend_names`` that cannot run anything here, and why (a platform they
    do not serve, a library not installed): run_matrix leaves them out."""
    plat = platform(device)
    reasons = {name: registry.get_backend(name).decline_reason(plat) for name in backend_names}
    return {name: reason for name, reason in reasons.items() if reason is not None}


def run_matrix(case_list: list[Case], backend_names: list[str], device, seed: int = 0,
               progress: Callable[[Result], None] | None = None, repeat: int = 1) -> list[Result]:
    """Each case on each backend that implements its op (a backend that does not has no result);
    ``seed`` + case position makes every case's inputs fresh, built once per case and shared, with
    the reference's result, by its backends; ``repeat`` > 1 also checks that launches and graph
    replays reproduce the first call bit for bit."""
    results = []
    for i, case in enumerate(case_list):
        names = [n for n in backend_names if case.op in registry.get_backend(n).implementations]
        try:
            inputs = case.build(device, seed + i) if names else None
        except Exception:
            inputs = None                     # run_case builds again and reports the error per backend
        reference = functools.cache(lambda: reference_call(case.op, inputs))
        for name in names:
            result = run_case(case, name, device, seed=seed + i, repeat=repeat, inputs=inputs,
                              reference=reference if inputs is not None else None)
            results.append(result)
            if progress:
                progress(result)
    return results


@dataclass
class Cell:
    """What one backend did on one op's cases."""

    passed: int = 0
    failed: int = 0
    errors: int = 0
    skipped: int = 0
    worst: float = 0.0
    reason: str = ""

    @property
    def text(self) -> str:
        """The matrix cell; every word is explained by ``LEGEND``."""
        ran = self.passed + self.failed + self.errors
        if self.failed or self.errors:
            parts = [f"FAIL {self.failed}/{ran}"] if self.failed else []
            parts += [f"error {self.errors}/{ran}"] if self.errors else []
            worst = f" ({self.worst:.2g})" if self.failed else ""
            return ", ".join(parts) + worst
        if self.passed:
            extra = f", {self.skipped} declined" if self.skipped else ""
            return f"pass {self.passed}{extra} ({self.worst:.2g})"
        if not self.skipped or "not registered" in self.reason:
            return "-"
        return "declined"


LEGEND = (
    "pass N: N cases matched the reference; (W): the worst case's error in units of the op's tolerance "
    "(<= 1 passes); FAIL F/N: F of N cases out of tolerance; error E/N: E cases raised an exception; "
    "M declined: cases the backend cannot serve here (e.g. a layout it does not read); declined: it serves "
    "none of the cases on this platform (reason below); -: the backend does not implement the op."
)


def result_rows(results: list[Result]) -> list[dict]:
    """Results as the rows of the JSON artifact (``worst`` None where it is NaN)."""
    return [dict(op=r.case.op, case=r.case.id, tier=r.case.tier, backend=r.backend, status=r.status,
                 worst=r.worst if r.worst == r.worst else None, message=r.message, seconds=round(r.seconds, 4),
                 seed=r.seed) for r in results]


def summarize(rows: list[dict]) -> dict[tuple[str, str], Cell]:
    """(backend, op) -> Cell over result rows (``result_rows`` or a JSON artifact's); "worst" is the
    largest error in units of the op's tolerance."""
    cells: dict[tuple[str, str], Cell] = {}
    for r in rows:
        cell = cells.setdefault((r["backend"], r["op"]), Cell())
        if r["status"] == "skip":
            cell.skipped += 1
            cell.reason = cell.reason or r["message"]
            continue
        if r["status"] == "error":
            cell.errors += 1
            continue
        if r["status"] == "pass":
            cell.passed += 1
        else:
            cell.failed += 1
        cell.worst = float("nan") if r["worst"] is None else max(cell.worst, r["worst"])
    return cells


def to_json(results: list[Result], meta: dict) -> str:
    return json.dumps(dict(meta=meta, results=result_rows(results)), indent=1)


__all__ = ["TIERS", "LEGEND", "Cell", "Case", "Result", "build_inputs", "cases", "make_case", "typical_case", "select_cases", "run_matrix", "summarize",
           "unavailable_backends",
           "result_rows", "to_json", "run_case"]
