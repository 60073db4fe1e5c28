"""Third-party backends (``dsv4ops.backends`` entry points) cannot break dispatch or impersonate an
in-tree backend; their failures are reported by ``backends()``, ``explain`` and ``dsv4ops info``."""
import importlib.metadata
import itertools
import textwrap

import pytest
import torch

import dsv4ops
from dsv4ops import priorities, registry, selection
from dsv4ops.conformance import build_inputs
from dsv4ops.registry import Backend, register_backend

_counter = itertools.count()


def topk_args():
    return build_inputs("indexer_topk", "cpu", torch.Generator().manual_seed(0), R=4, W=64, k=8, mode="ranges")


@pytest.fixture
def plugins(tmp_path, monkeypatch):
    """``install(name, source)``: a plugin module with that source, announced by an entry point
    ``name``; the registry then loads entry points again (in-tree modules are already imported).
    The registry's state is restored afterwards."""
    registry.load_backends()
    saved = (dict(registry._backends), {op: list(i) for op, i in registry._implementations.items()},
             dict(registry._load_errors), [(b, {op: list(i) for op, i in b.implementations.items()})
                                           for b in registry._backends.values()])
    real = list(importlib.metadata.entry_points(group=registry.ENTRY_POINT_GROUP))
    fake = []
    monkeypatch.syspath_prepend(str(tmp_path))
    entry_points = importlib.metadata.entry_points
    monkeypatch.setattr(importlib.metadata, "entry_points", lambda **kw: fake + real if kw.get("group") ==
                        registry.ENTRY_POINT_GROUP else entry_points(**kw))

    def install(name: str, source: str, module: str | None = None):
        module = module or f"fake_dsv4ops_plugin_{next(_counter)}"
        (tmp_path / f"{module}.py").write_text(textwrap.dedent(source))
        fake.append(importlib.metadata.EntryPoint(name, module, registry.ENTRY_POINT_GROUP))
        registry._loaded = False
        return module

    yield install
    with registry._lock:
        registry._backends.clear()
        registry._backends.update(saved[0])
        registry._implementations.clear()
        registry._implementations.update(saved[1])
        registry._load_errors.clear()
        registry._load_errors.update(saved[2])
        for backend, impls in saved[3]:
            backend.implementations.clear()
            backend.implementations.update(impls)
        registry._loaded = True
    selection.clear_cache()


def _status(decision) -> dict:
    return {c.backend: c.status for c in decision.candidates}


def _info(name: str) -> dsv4ops.BackendInfo:
    return next(b for b in dsv4ops.backends() if b.name.startswith(name))


GOOD_PLUGIN = """
from dsv4ops.registry import Backend, register_backend
B = register_backend(Backend({name!r}, ("cpu",), description="a plugin"))
def impl(a):
    raise AssertionError("never selected")
B.implements("indexer_topk", impl, priority=99, supports={supports})
"""


@pytest.mark.parametrize("supports,reason", [
    ("lambda plat, key: 1 / 0", "capability check raised ZeroDivisionError: division by zero"),
    ("lambda plat, key: key.softmax_scale", "capability check raised AttributeError: 'softmax_scale' is not part"),
    ("lambda plat, key: __import__('sys').exit(3)", "capability check raised SystemExit: 3"),
])
def test_raising_capability_check_declines_only_that_backend(plugins, supports, reason):
    plugins("broken_check", GOOD_PLUGIN.format(name="broken_check", supports=supports))
    kw = topk_args()
    expected = dsv4ops.reference.indexer_topk(**kw)
    assert torch.equal(dsv4ops.indexer_topk(**kw, backend="reference"), expected)
    dsv4ops.indexer_topk(**kw)                                  # by priority: the next backend serves
    d = dsv4ops.explain("indexer_topk", **kw)
    assert d.backend not in (None, "broken_check")
    assert _status(d)["broken_check"].startswith(reason)
    with pytest.raises(dsv4ops.UnsupportedError, match="capability check raised"):
        dsv4ops.indexer_topk(**kw, backend="broken_check")


def test_raising_probe_declines(plugins):
    plugins("broken_probe", """
        from dsv4ops.registry import Backend, register_backend
        def probe():
            raise SystemExit("vendor library called exit()")
        B = register_backend(Backend("broken_probe", ("cpu",), probe=probe))
        B.implements("indexer_topk", lambda a: None, priority=99)
    """)
    d = dsv4ops.explain("indexer_topk", **topk_args())
    assert d.backend != "broken_probe"
    assert "probe failed: SystemExit: vendor library called exit()" in _status(d)["broken_probe"]
    assert _info("broken_probe").reason.startswith("probe failed: SystemExit")


def test_raising_preference_declines_the_preferred_backend(plugins, monkeypatch):
    plugins("prefers", GOOD_PLUGIN.format(name="prefers", supports=None).replace("priority=99", "priority=10"))
    bad = priorities.Preference("indexer_topk", dsv4ops.platform().key, prefer="prefers", over="reference",
                                when=lambda key: key.nonexistent, evidence="a test")
    monkeypatch.setattr(priorities, "PREFERENCES", priorities.PREFERENCES + (bad,))
    kw = topk_args()
    assert torch.equal(dsv4ops.indexer_topk(**kw, backend="reference"), dsv4ops.reference.indexer_topk(**kw))
    d = dsv4ops.explain("indexer_topk", **kw)
    assert d.backend != "prefers"
    assert _status(d)["prefers"].startswith("preference over reference raised AttributeError")


def test_target_that_cannot_be_imported_declines(plugins):
    plugins("bad_target", """
        from dsv4ops.registry import Backend, register_backend
        B = register_backend(Backend("bad_target", ("cpu",)))
        B.implements("indexer_topk", "no_such_module_xyz.kernels:topk", priority=99)
    """)
    kw = topk_args()
    dsv4ops.indexer_topk(**kw)                                  # the next backend serves
    status = _status(dsv4ops.explain("indexer_topk", **kw))["bad_target"]
    assert status.startswith("cannot load no_such_module_xyz.kernels:topk: ModuleNotFoundError")


@pytest.mark.parametrize("body,reason", [
    ("raise SystemExit(2)", "failed to load: SystemExit: 2"),
    ("raise KeyboardInterrupt()", "failed to load: KeyboardInterrupt"),
    ("import no_such_vendor_library_xyz", "failed to load: ModuleNotFoundError"),
])
def test_failing_plugin_import_is_reported_and_leaves_nothing(plugins, body, reason):
    plugins("half_loaded", f"""
        from dsv4ops.registry import Backend, register_backend
        B = register_backend(Backend("half_loaded", ("cpu",)))
        B.implements("indexer_topk", lambda a: None, priority=99)
        {body}
    """)
    names = {b.name: b for b in dsv4ops.backends()}               # must not exit or raise
    assert names["half_loaded"].reason.startswith(reason) and not names["half_loaded"].available
    assert "half_loaded" not in registry.backend_names()          # what it registered was undone
    assert all(i.backend.name != "half_loaded" for i in registry.implementations("indexer_topk"))
    dsv4ops.indexer_topk(**topk_args())


def _assert_reference_is_genuine():
    kw = topk_args()
    impl = registry.get_backend("reference").implementations["indexer_topk"][0]
    assert impl.fn.__module__ == "dsv4ops.reference.impl.indexer_topk"
    assert torch.equal(dsv4ops.indexer_topk(**kw, backend="reference").sort(1).values,
                       dsv4ops.indexer_topk(**kw, backend="triton").sort(1).values)


IMPOSTOR = """
from dsv4ops.registry import Backend, register_backend
register_backend(Backend("innocent", ("cpu",))).implements("indexer_topk", lambda a: None, priority=1)
{attack}
"""


@pytest.mark.parametrize("attack", [
    'register_backend(Backend("reference", ("cpu",))).implements("indexer_topk", lambda a: None)',
    'Backend("reference", ("cpu",)).implements("indexer_topk", lambda a: None)',
    'from dsv4ops import registry\nregistry.get_backend("reference").implements("indexer_topk", lambda a: None)',
    'register_backend(Backend("triton", ("cpu",)))',
])
def test_plugin_cannot_take_an_in_tree_name(plugins, attack):
    plugins("impostor", IMPOSTOR.format(attack=attack))
    info = _info("impostor")
    assert not info.available and "ConfigError" in info.reason
    assert "belongs to an in-tree dsv4ops backend" in info.reason or "already taken" in info.reason
    assert "innocent" not in registry.backend_names()             # the whole plugin is refused
    _assert_reference_is_genuine()


def test_plugin_entry_point_with_an_in_tree_name_is_not_imported(plugins):
    module = plugins("reference", "raise AssertionError('must not be imported')")
    info = [b for b in dsv4ops.backends() if b.name.startswith("reference")]
    genuine = next(b for b in info if b.name == "reference")
    refused = next(b for b in info if b.name != "reference")
    assert genuine.available and refused.name == f"reference ({module})"
    assert refused.reason.startswith("refused: plugin entry point") and "in-tree backend 'reference'" in refused.reason
    _assert_reference_is_genuine()


def test_two_plugins_cannot_share_a_name(plugins):
    plugins("first", GOOD_PLUGIN.format(name="shared", supports=None))
    plugins("second", GOOD_PLUGIN.format(name="shared", supports=None))
    assert "already taken" in _info("second").reason
    assert registry.get_backend("shared").description == "a plugin"


def test_priority_must_be_an_int():
    b = Backend("bad_priority", ("cpu",))
    with pytest.raises(dsv4ops.ConfigError, match="priority= must be an int"):
        b.implements("indexer_topk", lambda a: None, priority="high")
    assert "indexer_topk" not in b.implementations


def test_direct_registration_cannot_replace_a_registered_backend():
    with pytest.raises(dsv4ops.ConfigError, match="'triton' is already taken"):
        register_backend(Backend("triton", ("cpu",)))
    assert registry.get_backend("triton").description.startswith("portable Triton")


def test_info_shows_refused_and_failing_plugins(plugins, capsys):
    from dsv4ops.cli import main
    plugins("exits", "raise SystemExit(5)")
    plugins("reference", "")
    assert main(["info"]) == 0
    out = capsys.readouterr().out
    assert "failed to load: SystemExit: 5" in out and "refused: plugin entry point" in out
