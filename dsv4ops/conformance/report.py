"""Render conformance JSON artifacts (``dsv4ops check --json``) as Markdown, and the
"verified where" table from all of them: ``python -m dsv4ops.conformance.report docs/conformance``."""
from __future__ import annotations

import json
import sys
from pathlib import Path

from .._table import render_table
from . import LEGEND, summarize


def render(data: dict) -> str:
    meta, results = data["meta"], data["results"]
    cells = summarize(results)
    backends = sorted({b for b, _ in cells})
    ops = list(dict.fromkeys(r["op"] for r in results))
    rows = [(b, *(cells[(b, op)].text if (b, op) in cells else "-" for op in ops)) for b in backends]
    libs = ", ".join(f"{v}" for v in meta.get("libraries", {}).values())
    lines = [f"# Conformance on {meta['device']}", "",
             f"- date: {meta['date']}", f"- platform: {meta['platform']}", f"- tier: {meta['tier']}, seed {meta['seed']}",
             f"- libraries: {libs}", f"- command: `{meta['command']}`", "",
             LEGEND, "",
             "```", render_table(("backend", *ops), rows), "```"]
    failures = [r for r in results if r["status"] in ("fail", "error")]
    if failures:
        lines += ["", "## Failures", ""] + [f"- {r['backend']} `{r['case']}`: {r['message']}" for r in failures]
    return "\n".join(lines) + "\n"


def verified_table(folder: Path) -> str:
    rows = []
    for path in sorted(folder.glob("*.json")):
        data = json.loads(path.read_text())
        for (backend, op), cell in sorted(summarize(data["results"]).items()):
            if cell.passed or cell.failed or cell.errors:
                rows.append((backend, op, data["meta"]["device"], data["meta"]["tier"], cell.text, path.name))
    return ("# What was verified where\n\nGenerated from `docs/conformance/*.json` by "
            "`python -m dsv4ops.conformance.report docs/conformance`. The reference and the Triton backend "
            "(interpreter) also run the quick tier in CI on every change. The flashinfer and aiter adapters "
            "are exercised only by contract tests in CI (tests/test_vendor_contracts.py: the adapter code "
            "against fakes of the vendors' documented semantics, on simulated platforms); they have not run "
            "on hardware. Anything not listed is unverified.\n\n"
            "```\n" + render_table(("backend", "op", "device", "tier", "result", "artifact"), rows) + "\n```\n")


def main(argv=None) -> int:
    folder = Path((argv or sys.argv[1:] or ["docs/conformance"])[0])
    for path in sorted(folder.glob("*.json")):
        path.with_suffix(".md").write_text(render(json.loads(path.read_text())))
    (folder.parent / "verified.md").write_text(verified_table(folder))
    return 0


if __name__ == "__main__":
    sys.exit(main())
