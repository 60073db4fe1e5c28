"""DeepSelect (``deep_select``) as an indexer_topk implementation on SM100 / SM103: the adapter runs
against the fake in tests/fakes/deep_select.py (no SM100 GPU here), and its calls are bound to the
released parameter list, read from the installed wheel's source where the wheel installs (it imports
only next to a CUDA build of torch)."""
import ast
import importlib
import importlib.metadata
import inspect
import types

import pytest
import torch
from dsv4ops.backends.deepselect import topk_inputs
from fakes import deep_select as fake_ds
from fakes import reprobed
from test_vendor_contracts import _bind_all, _recording, _simulated, import_release, source_signature

import dsv4ops
from dsv4ops.conformance import cases
from dsv4ops.conformance.cases import make_case
from dsv4ops.ops import OPS

DIST = "tokenspeed-deepselect"


@pytest.fixture
def deepselect(monkeypatch):
    fake_ds.install(monkeypatch)
    with reprobed(monkeypatch, "deepselect") as backend:
        yield backend


# Decode-form cases beyond the quick tier: column-major logits, k not a multiple of 8 (no direct
# output), k > W, a row width that is a multiple of 256 (already aligned), empty rows.
_EXTRA = [make_case("indexer_topk", R=6, W=300, k=16, mode="decode1d", next_n=2, column_major=True),
          make_case("indexer_topk", R=4, W=200, k=20, mode="decode2d", next_n=2, data="neg_inf", out=True),
          make_case("indexer_topk", R=4, W=50, k=64, mode="decode1d", corner="empty"),
          make_case("indexer_topk", R=3, W=512, k=40, mode="decode1d", data="ties"),
          make_case("indexer_topk", R=4, W=256, k=256, mode="decode2d", next_n=2, out=True)]


@pytest.mark.parametrize("arch", ["sm100", "sm103"])
def test_deepselect_topk_contract(deepselect, arch):
    """Decode rows are served (any strides, -inf / ties / empty rows, k > W); row ranges are declined."""
    ran, skipped = _simulated("cuda", arch, "indexer_topk", "deepselect", _EXTRA)
    assert {r.case.kwargs.get("mode") for r in ran} == {"decode1d", "decode2d"}
    assert len(ran) == len(_EXTRA) + sum(c.kwargs.get("mode", "ranges") != "ranges" for c in cases("indexer_topk"))
    assert skipped and all("no row start" in m for m in skipped.values())


def _key(W, k, decode=True):
    return types.SimpleNamespace(seq_lens=object() if decode else None, k=k,
                                 logits=types.SimpleNamespace(shape=(None, W)))


def test_deepselect_declines_with_reasons(deepselect):
    kw = make_case("indexer_topk", R=4, W=128, k=16, mode="decode1d").build("cpu", 0)
    with dsv4ops.simulate_platform("cuda", "sm90"):
        status = {c.backend: c.status for c in dsv4ops.explain("indexer_topk", **kw).candidates}
    assert status["deepselect"] == "arch sm90 not supported (needs sm100, sm103)"
    plat = types.SimpleNamespace(arch="sm100")
    assert topk_inputs(plat, _key(5000, 4100)) == "k=4100 > 4096 (DeepSelect's limit)"
    assert topk_inputs(plat, _key(100, 5000)) is None                  # served as min(k, W) = 100
    assert "fewer than 2^23" in topk_inputs(plat, _key(1 << 23, 16))
    assert "no row start" in topk_inputs(plat, _key(128, 16, decode=False))


def test_deepselect_not_chosen_over_triton(deepselect):
    """Not measured on hardware: below Triton unless forced (priorities.OP_PRIORITY)."""
    kw = make_case("indexer_topk", R=4, W=128, k=16, mode="decode1d").build("cpu", 0)
    with dsv4ops.simulate_platform("cuda", "sm100"):
        d = dsv4ops.explain("indexer_topk", **kw)
    priority = {c.backend: c.priority for c in d.candidates}
    assert priority["deepselect"] < priority["triton"]


def _long_rows(gen):
    """Rows longer than DeepSelect's 8192-element first window with fewer finite values than k."""
    R, W, k = 4, 8704, 16
    logits = torch.full((R, W), float("-inf"))
    cols = torch.randperm(W, generator=gen)[:6]
    logits[:, cols] = torch.randn(R, 6, generator=gen)
    logits[1, cols[0]] = float("nan")                   # a NaN inside a long row
    seq_lens = torch.tensor([W, W, 100, 0], dtype=torch.int32)
    return logits, k, seq_lens


def test_deepselect_placeholder_and_nan_rows(deepselect, gen):
    """The kernel pads with -inf (so long, mostly -inf rows may come back with padding positions) and
    traps on NaN; the adapter's copy makes -inf an ordinary candidate and NaN the lowest value."""
    logits, k, seq_lens = _long_rows(gen)
    aligned = torch.empty(4, 8704)
    aligned.copy_(logits)
    with pytest.raises(RuntimeError, match="NaN"):
        fake_ds.topk(aligned, k, end=seq_lens, indices_type=torch.int32, idx_oob_fill_value=-1, return_value=False)
    aligned[1] = 0.0
    _, raw = fake_ds.topk(aligned, k, end=seq_lens, indices_type=torch.int32, idx_oob_fill_value=-1,
                          return_value=False)
    assert bool((raw[0] >= 8704).any())                 # what the copy guards against
    with dsv4ops.simulate_platform("cuda", "sm100"):
        got = dsv4ops.indexer_topk(logits, k, seq_lens=seq_lens, backend="deepselect")
    kw = dict(logits=logits, k=k, seq_lens=seq_lens)
    clean = dict(kw, logits=torch.nan_to_num(logits, nan=float("-inf")))
    ref = dsv4ops.reference.indexer_topk(clean["logits"], k, seq_lens=seq_lens)
    verdict = OPS["indexer_topk"].spec.conformance.compare({}, clean, ref, kw, got)
    assert verdict.ok, verdict.message
    finite = torch.isfinite(logits[1]).nonzero().flatten()
    assert set(finite.tolist()) <= set(got[1].tolist())  # the NaN column ranks lowest


# ------------------------------------------------------------------------------------------------
# API-drift alarm

def _record(monkeypatch):
    calls = []
    fake_ds.install(monkeypatch, wrap=_recording(calls))
    with reprobed(monkeypatch, "deepselect"):
        _simulated("cuda", "sm100", "indexer_topk", "deepselect", _EXTRA)
    return calls


def test_deepselect_calls_bind_to_fake_signatures(monkeypatch):
    calls = _record(monkeypatch)
    called = _bind_all(calls, lambda path: inspect.signature(fake_ds.CALLED[path]))
    assert called == set(fake_ds.CALLED)


def _installed_signatures() -> dict:
    """path -> signature of the installed release: the real functions where ``deep_select`` imports
    (CUDA torch), else, where it cannot for want of CUDA, the definitions in the wheel's
    ``deep_select/interface.py``, which ``deep_select/__init__.py`` re-exports (checked). Skips where
    it is not installed; an import failing for another reason fails (``import_release``)."""
    module = import_release("deep_select", DIST, "cuda")
    if module is not None:
        return {path: inspect.signature(getattr(module, path.partition(":")[2])) for path in fake_ds.CALLED}
    dist = importlib.metadata.distribution(DIST)
    init = ast.parse(dist.locate_file("deep_select/__init__.py").read_text())
    exported = {alias.name for node in ast.walk(init) if isinstance(node, ast.ImportFrom)
                and node.module == "interface" for alias in node.names}
    interface = ast.parse(dist.locate_file("deep_select/interface.py").read_text())
    defs = {node.name: node for node in interface.body if isinstance(node, ast.FunctionDef)}
    found = {}
    for path in fake_ds.CALLED:
        name = path.partition(":")[2]
        assert name in exported and name in defs, f"{DIST} {dist.version}: deep_select.{name} is gone"
        found[path] = source_signature(defs[name])
    return found


def test_deepselect_calls_bind_to_installed_signatures(monkeypatch):
    """Where tokenspeed-deepselect is installed (imported or not): the recorded adapter calls bind to
    the released functions, and the fake's parameter lists equal the released ones."""
    real = _installed_signatures()
    with monkeypatch.context() as m:
        calls = _record(m)
    _bind_all(calls, real.__getitem__)
    for path, sig in real.items():
        ours = [(p.name, p.kind, p.default is p.empty) for p in inspect.signature(fake_ds.CALLED[path]).parameters.values()]
        theirs = [(p.name, p.kind, p.default is p.empty) for p in sig.parameters.values()]
        assert ours == theirs, f"{path}: the fake's parameters differ from {DIST}'s"


def test_deepselect_stride_requirement_matches_installed():
    """Where deep_select imports (a CUDA torch; a host call, any GPU): the fake's (1024, 32) bytes are
    the release's. The adapter itself reads the requirement from the installed release at run time."""
    module = import_release("deep_select", DIST, "cuda")
    if module is None:
        pytest.skip(f"{DIST} needs a CUDA torch to import (the requirement is a host call into it)")
    assert tuple(module.get_stride_requirement()) == fake_ds.get_stride_requirement()
