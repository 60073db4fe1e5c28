"""mqa_topk (docs/ops.md §13): the Triton kernel that selects while it scores (streaming_topk.py,
shared with paged_mqa_topk) against the conformance rule where its buffers compact many times, with
ties; its allocations; and the chunked composition it keeps for a topk too large for it."""
import importlib

import pytest
import torch
from dsv4ops.backends.triton import streaming_topk
from dsv4ops.backends.triton.tuning import tuning

import dsv4ops
from dsv4ops import registry
from dsv4ops.conformance import build_inputs, make_case, run_case
from dsv4ops.platform import platform

from helpers import G, allocation_sizes

triton_tuning = importlib.import_module("dsv4ops.backends.triton.tuning")   # the package exports tuning()


def conforms(params, kw, got) -> bool:
    return registry.get_op("mqa_topk").spec.conformance.compare(params, kw, None, kw, got).ok


@pytest.mark.parametrize("pieces", [1, 4])
@pytest.mark.parametrize("shape", [
    dict(T=5, S=200, ranges="causal", topk=3),              # up to 200 keys a row in tiles of 16: many compactions
    dict(T=6, S=96, ranges="requests", topk=5),
    dict(T=6, S=64, ranges="random", corner="empty", topk=40),    # rows shorter than topk, empty rows
])
def test_fused_passes_the_conformance_rule(env, pieces, shape):
    env(DSV4OPS_TRITON_TUNING=f"fused_path=stream,fused_max_pieces={pieces}")
    params = dict(H=8, **shape)
    kw = build_inputs("mqa_topk", "cpu", G(), **params)            # keys outside every range are NaN
    got = dsv4ops.mqa_topk(**kw, backend="triton")
    assert torch.equal((got >= 0).sum(1), (kw["ke"] - kw["ks"]).clamp(0, shape["topk"]))
    assert conforms(params, kw, got)


def test_ties_keep_any_of_the_equal_keys(env):
    env(DSV4OPS_TRITON_TUNING="fused_path=stream,fused_max_pieces=2")
    params = dict(T=4, S=120, H=8, ranges="causal", topk=6)
    kw = build_inputs("mqa_topk", "cpu", G(), **params)
    covered = ~kw["k_scale"].isnan()
    kw["k"].view(torch.uint8)[1::2] = torch.where(covered[1::2, None], kw["k"].view(torch.uint8)[:1],
                                                  kw["k"].view(torch.uint8)[1::2])
    kw["k_scale"][1::2] = torch.where(covered[1::2], kw["k_scale"][:1], kw["k_scale"][1::2])
    got = dsv4ops.mqa_topk(**kw, backend="triton")
    assert conforms(params, kw, got)


def test_the_fused_call_allocates_only_its_workspace(env, monkeypatch):
    env(DSV4OPS_TRITON_TUNING="fused_path=stream")
    kw = build_inputs("mqa_topk", "cpu", G(), T=6, S=300, H=4, ranges="causal", topk=8)
    sizes = allocation_sizes(monkeypatch, lambda: dsv4ops.mqa_topk(**kw, backend="triton"))
    tune = tuning(platform("cpu"))
    plan = streaming_topk.plan(6, 8, tune.mqa_block_s, tune, sms=4)
    assert sorted(sizes) == sorted([plan.workspace_bytes(6), 6 * 8 * 4])     # no [T, S] buffer


def test_the_chunked_call_allocates_one_chunk_of_logits(env, monkeypatch):
    """The default path: logits of the query rows that fit ``fused_prefill_chunk_bytes`` (3 rows of
    300 keys here), the top-k's own allocations, and the indices; never ``[T, S]``."""
    env(DSV4OPS_TRITON_TUNING="fused_prefill_chunk_bytes=4096")
    kw = build_inputs("mqa_topk", "cpu", G(), T=6, S=300, H=4, ranges="causal", topk=8)
    sizes = allocation_sizes(monkeypatch, lambda: dsv4ops.mqa_topk(**kw, backend="triton"))
    assert max(sizes) < 6 * 300 * 4 and 3 * 300 * 4 in sizes, sizes


def test_row_chunks_select_what_the_composition_selects(monkeypatch):
    """The chunked composition, for a topk whose buffer cannot fit a program."""
    kw = build_inputs("mqa_topk", "cpu", G(), T=7, S=40, H=8, ranges="requests", topk=8)
    monkeypatch.setattr(triton_tuning, "FUSED_MAX_BLOCK", 16)
    monkeypatch.setattr(triton_tuning, "LARGE_TOPK_CHUNK_BYTES", 2 * 40 * 4)      # two rows per chunk
    got = dsv4ops.mqa_topk(**kw, backend="triton")
    logits = dsv4ops.mqa_logits(kw["q"], kw["k"], kw["k_scale"], kw["weights"], kw["ks"], kw["ke"], backend="triton")
    want = dsv4ops.indexer_topk(logits, 8, row_starts=kw["ks"], row_ends=kw["ke"], backend="triton")
    assert torch.equal(got.sort(1).values, want.sort(1).values)
    case = make_case("mqa_topk", T=7, S=40, H=8, ranges="random", corner="empty", topk=16, out=True)
    assert run_case(case, "triton", "cpu").status == "pass"
