"""The performance pages cite artifacts that exist, and nothing current points into the archive.

docs/perf/README.md (the index), H100.md and H200.md (one page per GPU) name their artifacts as
paths relative to docs/perf (``H200-bench-s20.txt``, ``plots/fp8_einsum.png``,
``../conformance/H200-s20.json``). Superseded artifacts live in docs/perf/archive/, which only git
history and the archive itself may point into.

Each claim of the index's "Claims made elsewhere" table names the commit it was measured at and the
sources it measured; where git history is here, its "now" cell must say ``current`` when none of
those sources changed since, else ``stale: measured before `<commit>` changed `<file>` `` naming the
first commit that changed them.
"""
from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PERF = ROOT / "docs" / "perf"
ARCHIVE = PERF / "archive"
PAGES = ("README.md", "H100.md", "H200.md")

# An artifact path as the pages write it: a file name with an artifact's extension, optionally under
# plots/, archive/ or ../conformance/. Names continuing another path (``OUT/bench.json``,
# ``docs/perf/...``) or an extension-only shorthand (``.txt``) are not artifact mentions.
_ARTIFACT = re.compile(r"(?<![\w/.<-])((?:\.\./conformance/|plots/|archive/)?[A-Za-z0-9][\w.+-]*\.(?:txt|json|csv|png))")
_PLACEHOLDER = re.compile(r"^OUT\b")
# A path to a file in the archive (naming the folder itself points at no artifact).
_INTO_ARCHIVE = re.compile(r"\barchive/[\w.+-]+\.\w+")
# A perf artifact cited from outside docs/perf.
_CITED = re.compile(r"docs/perf/([\w.+-]+\.(?:txt|json|csv|png))")
_SCANNED = ("README.md", "docs", "dsv4ops", "backends", "tools", "tests")
_SUFFIXES = {".md", ".py", ".sh", ".toml", ".txt", ".cfg"}


def artifact_mentions(text: str) -> set[str]:
    return {m for m in _ARTIFACT.findall(text) if not _PLACEHOLDER.match(m)}


def scanned_files() -> list[Path]:
    files = []
    for name in _SCANNED:
        path = ROOT / name
        found = [path] if path.is_file() else sorted(p for p in path.rglob("*") if p.suffix in _SUFFIXES)
        files += [p for p in found if ARCHIVE not in p.parents and p != Path(__file__).resolve()]
    return files


@pytest.mark.parametrize("page", PAGES)
def test_every_cited_artifact_exists_outside_the_archive(page):
    mentions = artifact_mentions((PERF / page).read_text(encoding="utf-8"))
    assert mentions, f"docs/perf/{page} cites no artifact"
    missing = sorted(m for m in mentions if not (PERF / m).is_file())
    archived = sorted(m for m in mentions if ARCHIVE in (PERF / m).resolve().parents)
    assert not missing, f"docs/perf/{page} cites artifacts that do not exist: {missing}"
    assert not archived, f"docs/perf/{page} cites archived artifacts: {archived}"


def test_the_index_links_both_gpu_pages():
    index = (PERF / "README.md").read_text(encoding="utf-8")
    for page in PAGES[1:]:
        assert f"]({page})" in index, f"docs/perf/README.md does not link {page}"


def test_nothing_current_points_into_the_archive():
    problems = []
    for path in scanned_files():
        for number, line in enumerate(path.read_text(encoding="utf-8", errors="replace").splitlines(), 1):
            if _INTO_ARCHIVE.search(line):
                problems.append(f"{path.relative_to(ROOT)}:{number}: {line.strip()[:120]}")
    assert not problems, "paths into docs/perf/archive/ outside it:\n" + "\n".join(problems)


def test_artifacts_cited_from_outside_the_perf_pages_exist():
    problems = []
    for path in scanned_files():
        for name in _CITED.findall(path.read_text(encoding="utf-8", errors="replace")):
            if not (PERF / name).is_file():
                problems.append(f"{path.relative_to(ROOT)}: docs/perf/{name}")
    assert not problems, "cited perf artifacts missing from docs/perf:\n" + "\n".join(problems)


# -- claims and the sources they measured ----------------------------------------------------------
_COMMIT = re.compile(r"`([0-9a-f]{7,40})`")
_SOURCE = re.compile(r"`((?:backends|dsv4ops|reference|tools)/[\w/.-]*)`")
_STALE = re.compile(r"^stale: measured before `([0-9a-f]{7,40})` changed `([\w/.-]+)`")


def claim_rows() -> list[dict[str, str]]:
    """The rows of the index's "Claims made elsewhere" table, as {column: cell}."""
    section = (PERF / "README.md").read_text(encoding="utf-8").split("## Claims made elsewhere", 1)[1]
    lines = [line for line in section.split("\n## ", 1)[0].splitlines() if line.startswith("|")]
    split = lambda line: [cell.strip() for cell in line.strip().strip("|").split(" | ")]
    header = split(lines[0])
    return [dict(zip(header, split(line))) for line in lines[2:]]


def _git(*args: str) -> str | None:
    try:
        done = subprocess.run(("git", *args), cwd=ROOT, capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout.strip() if done.returncode == 0 else None


def first_change(commit: str, sources: list[str]) -> tuple[str, list[str]] | None:
    """The first commit after ``commit`` that changed any of ``sources``, and the ones it changed."""
    log = _git("log", "--reverse", "--format=%H", f"{commit}..HEAD", "--", *sources)
    if not log:
        return None
    first = log.split()[0]
    return first, _git("show", "--name-only", "--format=", first, "--", *sources).split()


def test_every_claim_names_its_commit_and_sources():
    rows = claim_rows()
    assert len(rows) > 10 and {"measured at", "sources", "now"} <= set(rows[0])
    bad = [row["claim"] for row in rows if not _COMMIT.search(row["measured at"]) or not _SOURCE.search(row["sources"])]
    assert not bad, f"claims without a commit or the sources they measured: {bad}"


def test_claims_whose_sources_changed_since_are_marked_stale():
    rows = claim_rows()
    commits = {_COMMIT.search(row["measured at"]).group(1) for row in rows}
    if _git("rev-parse", "--verify", "HEAD") is None or any(_git("cat-file", "-e", f"{c}^{{commit}}") is None
                                                             for c in commits):
        pytest.skip("no git history with the claims' commits here (a shallow clone or no git)")
    problems = []
    for row in rows:
        commit = _COMMIT.search(row["measured at"]).group(1)
        change = first_change(commit, _SOURCE.findall(row["sources"]))
        marked = _STALE.match(row["now"])
        if change is None and row["now"] != "current":
            problems.append(f"{row['claim']}: nothing changed since {commit}, so its 'now' is `current`")
        elif change is not None and not (marked and _git("rev-parse", marked.group(1)) == change[0]
                                          and marked.group(2) in change[1]):
            problems.append(f"{row['claim']}: 'now' must read: stale: measured before `{change[0][:7]}` changed "
                            f"`{change[1][0]}`")
    assert not problems, "docs/perf/README.md, Claims made elsewhere:\n" + "\n".join(problems)
