"""The documentation runs and stays self-contained.

(a) Every ```python block of docs/examples.md is executed (CPU, reference backend; the Triton
    backend too when TRITON_INTERPRET=1). Each block asserts on its own results.
(b) README.md and docs/**/*.md must not point outside the repository (to the design notes the
    project was specified from, or to helper scripts that live beside the checkout).
"""
from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "docs" / "examples.md"
OP_NAMES = ("qnorm_rope_kv_insert", "sparse_mla_decode", "paged_mqa_logits", "fp8_einsum", "indexer_topk", "mqa_logits")

_FENCE = re.compile(r"^```python[ \t]*\n(.*?)^```[ \t]*$", re.S | re.M)


def python_blocks(path: Path) -> list[tuple[int, str]]:
    """(first line number, code) of every ```python fence in ``path``."""
    text = path.read_text(encoding="utf-8")
    return [(text.count("\n", 0, m.start(1)) + 1, m.group(1)) for m in _FENCE.finditer(text)]


_BLOCKS = python_blocks(EXAMPLES)


def test_examples_cover_every_op():
    blocks = _BLOCKS
    assert len(blocks) >= len(OP_NAMES)
    for op in OP_NAMES:
        assert any(f"dsv4ops.{op}(" in code for _, code in blocks), f"docs/examples.md has no call of {op}"


@pytest.mark.parametrize("line, code", _BLOCKS, ids=[f"examples.md:{line}" for line, _ in _BLOCKS])
def test_example_runs(line, code):
    compiled = compile(code, f"{EXAMPLES.relative_to(ROOT)}:{line}", "exec")
    exec(compiled, {"__name__": "__docs_example__"})


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
