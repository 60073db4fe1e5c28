"""The kernel version a conformance row verified, and whether today's sources still are that version.

An implementation's sources are its module (the ``target`` it registered) and every module of
``dsv4ops.backends`` that module imports, transitively, as paths relative to the repository root
(``backends/triton/kth.py``). A run records each such file's hash (``file_hash``); a row's kernel
version is ``kernel_version`` over its implementation's files, and the row is stale when a file's
hash today differs from the recorded one (or the file is new to the implementation).

``dsv4ops check --json`` writes ``run_meta``: the commit, the settings that force a backend or a
path, and the hashes. Artifacts older than that record nothing: ``docs/conformance/versions.json``
holds, per such artifact, the commit that recorded it and its files' hashes at that commit, written
from git history by ``python -m dsv4ops.conformance.versions docs/conformance``.
"""
from __future__ import annotations

import ast
import hashlib
import importlib.util
import json
import os
import subprocess
import sys
from functools import cache
from pathlib import Path
from typing import Callable, Iterable

from .. import __version__, registry

BACKENDS_PACKAGE = "dsv4ops.backends"
BACKENDS_FOLDER = "backends"          # the package's folder in the repository
# The settings that choose which implementation or kernel path runs; a run records those set.
FORCING = ("DSV4OPS_BACKEND", "DSV4OPS_PLATFORM", "DSV4OPS_TRITON_TUNING", "DSV4OPS_TUNING_TABLE")
VERSIONS_FILE = "versions.json"


@cache
def _backends_root() -> Path:
    return Path(importlib.util.find_spec(BACKENDS_PACKAGE).submodule_search_locations[0])


def repository_root() -> Path:
    """The folder holding ``backends/`` (the checkout's root when run from one)."""
    return _backends_root().parent


def _module_file(module: str) -> Path | None:
    """The source file of ``module`` (a name under ``dsv4ops.backends``), or None if there is none."""
    parts = module.split(".")[2:]
    base = _backends_root().joinpath(*parts)
    for path in (base.with_suffix(".py"), base / "__init__.py"):
        if path.is_file():
            return path
    return None


def _imported_modules(module: str, path: Path) -> set[str]:
    """The ``dsv4ops.backends`` modules that ``module`` (its file ``path``) imports."""
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")
                anchor = anchor[:len(anchor) - node.level + 1]
                base = ".".join(anchor + ([base] if base else []))
            for alias in node.names:       # ``from . import kth`` names a module; ``from .kth import f`` not
                found.add(f"{base}.{alias.name}" if _module_file(f"{base}.{alias.name}") else base)
    return {m for m in found if m.startswith(BACKENDS_PACKAGE + ".") and _module_file(m)}


@cache
def module_closure(module: str) -> tuple[str, ...]:
    """``module`` and the ``dsv4ops.backends`` modules it imports, transitively, as repository paths."""
    seen, todo = set(), [module]
    while todo:
        name = todo.pop()
        path = _module_file(name)
        if name in seen or path is None:
            continue
        seen.add(name)
        todo.extend(_imported_modules(name, path))
    return tuple(sorted(_repository_path(_module_file(m)) for m in seen))


def _repository_path(path: Path) -> str:
    return (Path(BACKENDS_FOLDER) / path.relative_to(_backends_root())).as_posix()


def implementation_files(backend: str, op: str) -> tuple[str, ...]:
    """The repository paths of ``backend``'s implementation of ``op`` (empty if it has none here)."""
    modules = {impl.target.partition(":")[0] for impl in registry.implementations(op)
               if impl.backend.name == backend and isinstance(impl.target, str)}
    return tuple(sorted({p for m in modules if m.startswith(BACKENDS_PACKAGE + ".") for p in module_closure(m)}))


def file_hash(content: bytes | None) -> str | None:
    """sha256 of a file's bytes, 12 hex digits; None for a file that does not exist."""
    return None if content is None else hashlib.sha256(content).hexdigest()[:12]


def kernel_version(hashes: dict[str, str | None]) -> str:
    """One 8-hex-digit version over an implementation's files and their hashes."""
    text = "\n".join(f"{path} {hashes[path]}" for path in sorted(hashes))
    return hashlib.sha256(text.encode()).hexdigest()[:8]


def read_current(path: str) -> bytes | None:
    file = repository_root() / path
    return file.read_bytes() if file.is_file() else None


def source_hashes(paths: Iterable[str], read: Callable[[str], bytes | None] = read_current) -> dict[str, str | None]:
    return {path: file_hash(read(path)) for path in sorted(set(paths))}


def pairs_files(pairs: Iterable[tuple[str, str]]) -> set[str]:
    """The files of every (backend, op) implementation in ``pairs``."""
    return {path for backend, op in pairs for path in implementation_files(backend, op)}


def _git(*args: str) -> str | None:
    """A git command's output in the repository root, or None where git or its history is absent."""
    try:
        done = subprocess.run(("git", *args), cwd=repository_root(), capture_output=True, timeout=60)
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout.decode() if done.returncode == 0 else None


def current_commit() -> str:
    """The checkout's commit (``-dirty`` when its files differ from it), else (an installed package)
    the package version."""
    top = _git("rev-parse", "--show-toplevel")
    described = _git("describe", "--always", "--dirty", "--abbrev=12")
    if top and described and Path(top.strip()).resolve() == repository_root().resolve():
        return described.strip()
    return f"dsv4ops {__version__}"


def forced_settings() -> dict[str, str]:
    return {name: os.environ[name] for name in FORCING if os.environ.get(name)}


def run_meta(pairs: Iterable[tuple[str, str]]) -> dict:
    """What a conformance artifact records of the code it ran: the commit, the forcing settings, and
    the hash of each source file of the (backend, op) implementations in ``pairs``."""
    return dict(commit=current_commit(), settings=forced_settings(), sources=source_hashes(pairs_files(pairs)))


def verified_pairs(rows: list[dict]) -> set[tuple[str, str]]:
    """The (backend, op) pairs that ran (passed, failed or raised) in an artifact's result rows."""
    return {(r["backend"], r["op"]) for r in rows if r["status"] != "skip"}


# -- artifacts that record no sources: their versions from git history --------------------------------
def read_at(commit: str) -> Callable[[str], bytes | None]:
    def read(path: str) -> bytes | None:
        try:
            done = subprocess.run(("git", "show", f"{commit}:{path}"), cwd=repository_root(),
                                  capture_output=True, timeout=60)
        except (OSError, subprocess.SubprocessError):
            return None
        return done.stdout if done.returncode == 0 else None
    return read


def has_history(commit: str) -> bool:
    return _git("cat-file", "-e", f"{commit}^{{commit}}") is not None


def artifacts(folder: Path) -> list[Path]:
    """The conformance artifacts of ``folder`` (every JSON file but versions.json), sorted."""
    return sorted(p for p in folder.glob("*.json") if p.name != VERSIONS_FILE)


def derived_versions(folder: Path, kept: dict) -> dict:
    """versions.json's content: for each artifact of ``folder`` without recorded sources, the commit
    that recorded it (``kept``'s entry where there is one: later edits of an artifact's meta do not
    move it) and its implementations' file hashes at that commit. Needs git history."""
    versions = {}
    for path in artifacts(folder):
        data = json.loads(path.read_text())
        if "sources" in data["meta"]:
            continue
        commit = kept.get(path.name, {}).get("commit")
        if commit is None:
            log = _git("log", "-1", "--format=%h", "--", path.relative_to(repository_root()).as_posix())
            if not log:
                raise RuntimeError(f"{path}: no git history records it (run from a checkout with its history)")
            commit = log.strip()
        files = pairs_files(verified_pairs(data["results"]))
        versions[path.name] = dict(commit=commit, sources=source_hashes(files, read_at(commit)))
    return versions


def load_versions(folder: Path) -> dict:
    path = folder / VERSIONS_FILE
    return json.loads(path.read_text()) if path.is_file() else {}


def main(argv=None) -> int:
    folder = Path((argv or sys.argv[1:] or ["docs/conformance"])[0]).resolve()
    versions = derived_versions(folder, load_versions(folder))
    (folder / VERSIONS_FILE).write_text(json.dumps(versions, indent=1, sort_keys=True) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
