"""The composed backend (backends/composed): the indexer in one call as its two dispatched ops.
Its results are checked by the conformance matrix (test_conformance.py) like every backend's;
here: which kernels its parts run, when it declines and why, and that it allocates a bounded
workspace, never the [rows, context] logits."""
import pytest
import torch
from helpers import G, allocation_sizes, needs_triton

import dsv4ops
from dsv4ops import composition
from dsv4ops.conformance import build_inputs

PAGED = dict(B=5, next_n=2, context=64, H=8, block_size=16, topk=8)


def _status(op, kw):
    """The composed implementation's line in ``explain``."""
    return next(c.status for c in dsv4ops.explain(op, **kw).candidates if c.implementation == "composed")


@needs_triton
@pytest.mark.parametrize("op,part", [("paged_mqa_topk", "paged_mqa_logits"), ("paged_mqa_topk", "indexer_topk"),
                                     ("mqa_topk", "mqa_logits"), ("mqa_topk", "indexer_topk")])
def test_declines_when_a_part_has_only_the_reference(env, op, part):
    """With a part forced to the reference (DSV4OPS_BACKEND), the composition would be the reference
    twice over: it declines and names the part; with every part on a kernel it serves."""
    params = PAGED if op == "paged_mqa_topk" else dsv4ops.OPS[op].spec.conformance.typical
    kw = build_inputs(op, "cpu", G(), **params)
    assert _status(op, kw) in ("selected", "available, lower priority")
    env(DSV4OPS_BACKEND=f"{part}=reference")
    assert _status(op, kw) == f"part {part} is served by the reference alone here"


@needs_triton
def test_declines_when_a_part_is_not_served(env):
    env(DSV4OPS_BACKEND="indexer_topk=deepselect")              # no such library here
    kw = build_inputs("paged_mqa_topk", "cpu", G(), **PAGED)
    status = _status("paged_mqa_topk", kw)
    assert status.startswith("part indexer_topk: indexer_topk: no implementation can serve these inputs"), status


@needs_triton
@pytest.mark.parametrize("op", ["paged_mqa_topk", "mqa_topk"])
def test_parts_run_through_dispatch_in_bounded_chunks(monkeypatch, op):
    """A budget of two requests' (rows') logits: the workspace is that, the parts are dispatched
    once per chunk (three chunks of five), and the selection is the reference's."""
    params = PAGED if op == "paged_mqa_topk" else dict(T=5, H=8, S=48, topk=8)
    kw = build_inputs(op, "cpu", G(), **params)
    if op == "paged_mqa_topk":
        row_bytes, budget = PAGED["next_n"] * kw["max_context_len"] * 4, "DECODE_CHUNK_BYTES"
    else:
        row_bytes, budget = kw["k"].shape[0] * 4, "PREFILL_CHUNK_BYTES"
    monkeypatch.setattr(composition, budget, 2 * row_bytes)
    calls = []
    for part in ("paged_mqa_logits", "mqa_logits", "indexer_topk"):
        fn = dsv4ops.OPS[part].function
        monkeypatch.setattr(dsv4ops.OPS[part], "function", lambda *a, _fn=fn, _part=part, **k: calls.append(_part)
                            or _fn(*a, **k))
    sizes = allocation_sizes(monkeypatch, lambda: dsv4ops.dispatch(op, **kw, backend="composed"))
    assert 2 * row_bytes in sizes and max(sizes) < 5 * row_bytes, sizes
    assert len(calls) == 6 and calls[1::2] == ["indexer_topk"] * 3, calls
    got = dsv4ops.dispatch(op, **kw, backend="composed")
    want = dsv4ops.dispatch(op, **kw, backend="reference")
    assert torch.equal(got.sort(1).values, want.sort(1).values)
