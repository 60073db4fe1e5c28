"""The package has no import cycle, imports inside functions counted.

The graph is built from the source (nothing is imported): an edge goes from a module to each module
it names in an ``import`` statement anywhere in its body or in ``importlib.import_module("...")``
with a literal name, to the most specific module named (``from . import formats`` is an edge to
``dsv4ops.formats``, ``from .formats import Layout`` too; ``import dsv4ops`` to the package).
"""
import ast
import importlib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = {"dsv4ops": ROOT / "dsv4ops", "dsv4ops.reference": ROOT / "reference", "dsv4ops.backends": ROOT / "backends"}


def modules() -> dict[str, Path]:
    """Module name -> file, with the package-dir mapping of pyproject.toml."""
    found = {}
    for package, folder in PACKAGES.items():
        for path in folder.rglob("*.py"):
            parts = list(path.relative_to(folder).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            found[".".join([package, *parts])] = path
    return found


def _named(node, module: str, is_package: bool) -> list[str]:
    """The modules an import statement names (before resolving to the ones that exist)."""
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    base = module if is_package else module.rpartition(".")[0]
    for _ in range(node.level - 1):
        base = base.rpartition(".")[0]
    target = (base + ("." + node.module if node.module else "")) if node.level else node.module
    return [f"{target}.{alias.name}" for alias in node.names] + [target]


def graph() -> dict[str, set[str]]:
    known = modules()

    def existing(name: str) -> str | None:
        while name not in known and "." in name:
            name = name.rpartition(".")[0]
        return name if name in known else None

    edges = {}
    for module, path in known.items():
        deps = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                names = _named(node, module, path.name == "__init__.py")
                if isinstance(node, ast.ImportFrom):       # `from x import y`: y if a module, else x
                    *members, target = names
                    names = [m if m in known else target for m in members]
                deps.update(filter(None, map(existing, names)))
            elif (isinstance(node, ast.Call) and getattr(node.func, "attr", None) == "import_module"
                  and node.args and isinstance(node.args[0], ast.Constant)):
                deps.add(existing(node.args[0].value))
        edges[module] = {d for d in deps if d and d != module}
    return edges


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index, low, stack, on_stack, found = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in edges[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in edges:
        if v not in index:
            visit(v)
    return found


def test_no_import_cycle():
    edges = graph()
    assert len(edges) > 50
    found = cycles(edges)
    assert not found, "import cycles: " + "; ".join(
        " <-> ".join(f"{m} -> {sorted(edges[m] & set(c))}" for m in c) for c in found)


@pytest.mark.parametrize("leaf", ["dsv4ops.settings", "dsv4ops.errors", "dsv4ops.formats", "dsv4ops.rows",
                                  "dsv4ops.tolerance", "dsv4ops.sampling", "dsv4ops.tensors", "dsv4ops.cost",
                                  "dsv4ops.cache_checks", "dsv4ops.index_checks", "dsv4ops.deployment"])
def test_leaf_modules_import_no_feature(leaf):
    """Configuration and the helpers that adapters, references and the harness share depend only on
    one another: never on ops, dispatch, verification or the conformance harness."""
    edges = graph()
    reached, todo = set(), [leaf]
    while todo:
        for dep in edges[todo.pop()] - reached:
            reached.add(dep)
            todo.append(dep)
    features = {m for m in reached if m.startswith(("dsv4ops.ops", "dsv4ops.conformance", "dsv4ops.selection",
                                                     "dsv4ops.verify", "dsv4ops.registry", "dsv4ops.opspec"))}
    assert not features, f"{leaf} reaches {sorted(features)}"


def test_dispatch_never_reaches_the_conformance_harness():
    edges = graph()
    reached, todo = set(), ["dsv4ops.selection", "dsv4ops.verify", "dsv4ops.prepared"]
    while todo:
        for dep in edges[todo.pop()] - reached:
            reached.add(dep)
            todo.append(dep)
    assert not {m for m in reached if m.startswith("dsv4ops.conformance")}


def test_op_modules_import_only_their_compositions():
    """An op module imports another op's module only where its op is declared a composition of that
    op (``OpSpec.composes``: mqa_topk of mqa_logits, ...), never to borrow helpers (shared pieces live
    in leaf modules); and no op module looks itself up by name through the registry."""
    edges, known = graph(), modules()
    op_modules = {m for m in known if m.startswith("dsv4ops.ops.")}
    assert len(op_modules) >= 14
    for module in sorted(op_modules):
        spec = importlib.import_module(module).OP.spec
        assert module == f"dsv4ops.ops.{spec.name}" and set(spec.composes) <= {m.rpartition(".")[2] for m in op_modules}
        borrowed = {m.rpartition(".")[2] for m in edges[module] & op_modules} - set(spec.composes)
        assert not borrowed, f"{module} imports the op modules {sorted(borrowed)}, which {spec.name} does not compose"
        self_lookups = [node.lineno for node in ast.walk(ast.parse(known[module].read_text()))
                        if isinstance(node, ast.Call) and getattr(node.func, "attr", None) == "get_op"
                        and node.args and isinstance(node.args[0], ast.Constant) and node.args[0].value == spec.name]
        assert not self_lookups, f"{module} looks {spec.name} up through the registry (lines {self_lookups}): use OP"


def test_a_planted_cycle_is_found():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_core_imports_no_backend_internals():
    """The core (``dsv4ops`` and its ops, conformance and examples) knows backends only through the
    registry: it may import the ``dsv4ops.backends`` package (the entry-point namespace ``backends()``
    lists), never a module inside a backend (a kernel, a launcher, a backend's warm-up internals)."""
    edges = graph()
    core = [m for m in edges if m == "dsv4ops" or (m.startswith("dsv4ops.")
                                                    and not m.startswith(("dsv4ops.backends", "dsv4ops.reference")))]
    assert "dsv4ops.warm_up" in core and "dsv4ops.ops.indexer_topk" in core
    found = {m: sorted(d for d in edges[m] if d.startswith("dsv4ops.backends.")) for m in core}
    assert not {m: d for m, d in found.items() if d}, f"core modules importing backend internals: {found}"
