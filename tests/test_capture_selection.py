"""Capture-aware selection: whether an implementation can be captured in a CUDA graph is declared
data (``implements(..., cannot_capture=why)``); while a stream is capturing, automatic selection
skips the ones that cannot, ``explain`` says why, and ``prepare(capturable=True)`` picks a
capturable one before capture. Simulated on the CPU: a capturing stream is a patched check."""
import pytest
import torch

import dsv4ops
from dsv4ops import registry, selection
from dsv4ops.conformance import build_inputs
from dsv4ops.ops import OPS
from dsv4ops.registry import Backend, register_backend, unregister_backend

WHY = "it synchronizes with the host"


@pytest.fixture
def syncing():
    """A CPU backend whose top-priority indexer_topk cannot be captured (it runs the reference)."""
    calls = []

    def topk(a):
        calls.append(1)
        return registry.get_backend("reference").implementations["indexer_topk"][0].fn(a)

    backend = register_backend(Backend("syncing", ("cpu",)))
    backend.implements("indexer_topk", topk, priority=10_000, cannot_capture=WHY)
    yield calls
    unregister_backend("syncing")


def _same_sets(a, b) -> bool:
    """Top-k results hold the same index set per row (the contract fixes sets, not order)."""
    return torch.equal(a.sort(1).values, b.sort(1).values)


def _topk_args():
    return build_inputs("indexer_topk", "cpu", torch.Generator().manual_seed(0), R=4, W=64, k=8, mode="ranges")


def test_declared_on_the_implementations_that_gather_a_workspace():
    from dsv4ops.backends import aiter, flashmla
    assert flashmla.BACKEND.implementations["sparse_mla_prefill"][0].cannot_capture
    assert aiter.BACKEND.implementations["sparse_mla_prefill"][0].cannot_capture
    assert flashmla.BACKEND.implementations["sparse_mla_decode"][0].cannot_capture is None


def test_selection_skips_what_cannot_be_captured(syncing, monkeypatch):
    kw = _topk_args()
    assert dsv4ops.explain("indexer_topk", **kw).backend == "syncing"
    monkeypatch.setattr(selection, "capturing", lambda device: True)       # the stream is capturing
    decision = dsv4ops.explain("indexer_topk", **kw)
    assert decision.backend != "syncing"
    status = next(c.status for c in decision.candidates if c.backend == "syncing")
    assert status == f"a CUDA graph cannot capture it ({WHY})"


def test_forced_backend_under_capture_is_declined_with_the_reason(syncing):
    decision = dsv4ops.explain("indexer_topk", **_topk_args(), backend="syncing", capturable=True)
    assert decision.selected is None and WHY in decision.error


def test_prepare_for_capture_picks_a_capturable_implementation(syncing):
    kw = _topk_args()
    assert dsv4ops.prepare("indexer_topk", **kw).backend == "syncing"
    prepared = dsv4ops.prepare("indexer_topk", **kw, capturable=True)
    assert prepared.backend != "syncing"
    assert _same_sets(prepared.run(), dsv4ops.reference.indexer_topk(**kw))


def test_a_cached_choice_hands_captured_calls_to_a_capturable_implementation(syncing, monkeypatch):
    """The fast path caches one choice per structure, made outside capture; the non-capturable
    implementation's runner checks for capture itself and passes those calls on (checked before any
    launch: the syncing implementation is never called while capturing)."""
    op = OPS["indexer_topk"]
    args = op.validate_call(**_topk_args()).args
    decision = selection.choose(op.validate(args), None, capturable=False)
    assert decision.backend == "syncing"
    run = selection._outside_capture(op, decision.selected.bound(decision.platform), torch.device("cpu"), None)
    run(args)
    assert len(syncing) == 1
    monkeypatch.setattr(selection, "capturing", lambda device: True)
    expected = dsv4ops.reference.indexer_topk(**_topk_args())
    assert _same_sets(run(args), expected)
    assert len(syncing) == 1                                             # not called under capture
    forced = selection._outside_capture(op, decision.selected.bound(decision.platform), torch.device("cpu"),
                                        "syncing")
    with pytest.raises(dsv4ops.UnsupportedError, match=WHY):
        forced(args)
    assert len(syncing) == 1
