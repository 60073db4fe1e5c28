"""mqa_topk (docs/ops.md §13): the Triton implementation computes logits for chunks of query rows
inside a fixed workspace and selects exactly what the composition selects."""
import torch
from dsv4ops.backends.triton import paged_mqa_topk as workspace

import dsv4ops
from dsv4ops.conformance import build_inputs, make_case, run_case


def test_row_chunks_select_what_the_composition_selects(monkeypatch):
    kw = build_inputs("mqa_topk", "cpu", torch.Generator().manual_seed(5), T=7, S=40, H=8, ranges="requests", topk=8)
    monkeypatch.setattr(workspace, "WORKSPACE_BYTES", 2 * 40 * 4)                 # two rows per chunk
    got = dsv4ops.mqa_topk(**kw, backend="triton")
    logits = dsv4ops.mqa_logits(kw["q"], kw["k"], kw["k_scale"], kw["weights"], kw["ks"], kw["ke"], backend="triton")
    want = dsv4ops.indexer_topk(logits, 8, row_starts=kw["ks"], row_ends=kw["ke"], backend="triton")
    assert torch.equal(got.sort(1).values, want.sort(1).values)
    case = make_case("mqa_topk", T=7, S=40, H=8, ranges="random", corner="empty", topk=16, out=True)
    assert run_case(case, "triton", "cpu").status == "pass"
