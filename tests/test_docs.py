"""The documentation runs, links up and stays self-contained.

(a) Every ```python block of docs/examples.md and README.md is executed (CPU; the reference
    backend, the Triton backend too when TRITON_INTERPRET=1). Each block asserts on its own results.
(b) README.md lists every op and the one list of main-cache layouts, and its two CI command lines
    are the first lines .ci/run finds.
(c) Every relative link of README.md and docs/**/*.md resolves (file and heading), and every page
    under docs/ is reachable from the index, docs/README.md.
(d) README.md and docs/**/*.md must not point outside the repository (to the design notes the
    project was specified from, or to helper scripts that live beside the checkout).
"""
from __future__ import annotations

import re
from pathlib import Path

import pytest

from dsv4ops import formats
from dsv4ops.ops import OP_NAMES

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
DOCS_INDEX = ROOT / "docs" / "README.md"
EXAMPLES = ROOT / "docs" / "examples.md"

_FENCE = re.compile(r"^```python[ \t]*\n(.*?)^```[ \t]*$", re.S | re.M)


def python_blocks(path: Path) -> list[tuple[int, str]]:
    """(first line number, code) of every ```python fence in ``path``."""
    text = path.read_text(encoding="utf-8")
    return [(text.count("\n", 0, m.start(1)) + 1, m.group(1)) for m in _FENCE.finditer(text)]


_BLOCKS = python_blocks(EXAMPLES)


def test_examples_cover_every_op():
    """Every op runs in a block of docs/examples.md: called by name, or (sparse_mla_prefill) named by
    the whole-layer block that asserts it ran."""
    missing = [op for op in OP_NAMES if not any(re.search(rf"\b{op}\b", code) for _, code in _BLOCKS)]
    assert not missing, f"docs/examples.md runs no block with {missing}"


_RUNNABLE = [(path, line, code) for path in (EXAMPLES, README) for line, code in python_blocks(path)]


@pytest.mark.parametrize("path, line, code", _RUNNABLE, ids=[f"{p.name}:{line}" for p, line, _ in _RUNNABLE])
def test_example_runs(path, line, code):
    compiled = compile(code, f"{path.relative_to(ROOT)}:{line}", "exec")
    exec(compiled, {"__name__": "__docs_example__"})


# ---------------------------------------------------------------------------------------------
def markdown_section(path: Path, heading: str) -> str:
    """The text under ``heading`` (a ``## `` line) up to the next ``## `` heading."""
    text = path.read_text(encoding="utf-8")
    match = re.search(rf"^## {re.escape(heading)}\n(.*?)(?=^## |\Z)", text, re.S | re.M)
    assert match, f"{path.relative_to(ROOT)} has no section '## {heading}'"
    return match.group(1)


def test_readme_has_a_runnable_example():
    assert python_blocks(README), "README.md has no ```python block (its minimal example)"


def test_readme_lists_every_op():
    rows = re.findall(r"^\| `(\w+)` \|", markdown_section(README, "Ops"), re.M)
    assert rows == list(OP_NAMES), f"README.md's op table lists {rows}, the ops are {list(OP_NAMES)}"


def test_readme_names_the_layouts():
    text = markdown_section(README, "Ops")
    paragraph = text[text.index("Cache layouts"):].split("\n\n")[0]
    main = [name for name in re.findall(r"`(\w+)`", paragraph.split(";")[0]) if name in formats.ALL_LAYOUTS]
    assert main == list(formats.MAIN_LAYOUTS), f"README.md's layout= list {main} != formats.MAIN_LAYOUTS"
    named = set(re.findall(r"`(\w+)`", paragraph))
    assert set(formats.ALL_LAYOUTS) <= named, f"README.md does not name {set(formats.ALL_LAYOUTS) - named}"


@pytest.mark.parametrize("key", ["TRITON_INTERPRET=1 dsv4ops check", "TRITON_INTERPRET=1 python3 -m pytest -q"])
def test_readme_commands_are_what_ci_runs(key):
    """.ci/run evaluates the first README line holding ``key``: it must be the pinned install command."""
    first = next((line for line in README.read_text(encoding="utf-8").splitlines() if key in line), None)
    assert first is not None, f"README.md has no line with {key!r}"
    assert first.startswith("python3 -m pip install") and "torch==2.13.0" in first, first


# ---------------------------------------------------------------------------------------------
_FENCED = re.compile(r"^```.*?^```[ \t]*$", re.S | re.M)
_CODE = re.compile(rf"{_FENCED.pattern}|`[^`\n]*`", re.S | re.M)
_LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
_HEADING = re.compile(r"^#{1,6}[ \t]+(.+?)[ \t]*#*[ \t]*$", re.M)


def links(path: Path) -> list[str]:
    """The targets of the markdown links of ``path``, code blocks and code spans left out."""
    return _LINK.findall(_CODE.sub("", path.read_text(encoding="utf-8")))


def anchors(path: Path) -> set[str]:
    """The heading anchors of ``path`` as GitHub writes them (lower case, punctuation dropped,
    spaces to '-', repeats numbered)."""
    seen: dict[str, int] = {}
    for heading in _HEADING.findall(_FENCED.sub("", path.read_text(encoding="utf-8"))):
        slug = re.sub(r"[^\w\- ]", "", heading.lower()).replace(" ", "-")
        seen[slug] = seen.get(slug, -1) + 1
        if seen[slug]:
            seen[f"{slug}-{seen[slug]}"] = 0
    return set(seen)


def resolve(path: Path, target: str) -> tuple[Path, str] | None:
    """(file, anchor) a relative link points at; None for web links."""
    if re.match(r"^[a-z][a-z0-9+.-]*:", target, re.I):
        return None
    file, _, anchor = target.partition("#")
    return ((path.parent / file).resolve() if file else path), anchor


def test_relative_links_resolve():
    problems = []
    for path in doc_files():
        for target in links(path):
            resolved = resolve(path, target)
            if resolved is None:
                continue
            file, anchor = resolved
            if not file.exists():
                problems.append(f"{path.relative_to(ROOT)}: ({target}): no such file")
            elif anchor and file.suffix == ".md" and anchor not in anchors(file):
                problems.append(f"{path.relative_to(ROOT)}: ({target}): no heading with that anchor")
    assert not problems, "broken links:\n" + "\n".join(problems)


def test_every_doc_page_is_reachable_from_the_index():
    """Following links from docs/README.md through the pages under docs/ reaches every page there
    (docs/perf/archive/, superseded measurements, excepted)."""
    docs = (ROOT / "docs").resolve()
    pages = {p for p in docs.rglob("*.md") if not p.is_relative_to(docs / "perf" / "archive")}
    seen, todo = set(), [DOCS_INDEX.resolve()]
    while todo:
        page = todo.pop()
        if page in seen or page not in pages:
            continue
        seen.add(page)
        todo += [resolved[0] for resolved in (resolve(page, t) for t in links(page)) if resolved is not None]
    missing = sorted(str(p.relative_to(docs)) for p in pages - seen)
    assert not missing, f"pages not reachable from docs/README.md by links: {missing}"


# ---------------------------------------------------------------------------------------------
_OUTSIDE = [
    (re.compile(r"shared/spec"), "the specification folder outside the repository"),
    (re.compile(r"\.\./shared"), "a path outside the repository"),
    (re.compile(r"(?<![\w-])api\.md"), "the API design note outside the repository"),
    (re.compile(r"vendors\.md"), "the vendor notes outside the repository"),
    (re.compile(r"(?<!docs/)ops\.md §"), "a section of ops.md not written as docs/ops.md §N"),
    (re.compile(r"\bDecision\s+\d", re.I), "a numbered design decision of the outside specification"),
    (re.compile(r"open question", re.I), "an open question of the outside specification"),
]


def doc_files() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]


def test_docs_are_self_contained():
    problems = []
    for path in doc_files():
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            for pattern, why in _OUTSIDE:
                if pattern.search(line):
                    problems.append(f"{path.relative_to(ROOT)}:{number}: {why}: {line.strip()[:120]}")
    assert not problems, "documentation points outside the repository:\n" + "\n".join(problems)
