"""paged_mqa_topk (docs/ops.md §12): the Triton implementation keeps its logits inside a fixed
workspace, chunk by chunk, and still selects exactly what the composition selects."""
import pytest
import torch
from dsv4ops.backends.triton import paged_mqa_topk as triton_paged_topk

import dsv4ops
from dsv4ops.conformance import build_inputs, make_case, run_case

G = lambda: torch.Generator().manual_seed(5)


@pytest.mark.parametrize("next_n", [1, 2])
def test_chunks_smaller_than_the_batch_select_what_the_composition_selects(monkeypatch, next_n):
    """A workspace of one request's rows: every request is its own chunk (the last one too)."""
    kw = build_inputs("paged_mqa_topk", "cpu", G(), B=5, next_n=next_n, context=40, H=8, block_size=16, topk=16)
    monkeypatch.setattr(triton_paged_topk, "WORKSPACE_BYTES", next_n * kw["max_context_len"] * 4)
    assert triton_paged_topk.per_chunk(next_n * kw["max_context_len"] * 4) == 1
    got = dsv4ops.paged_mqa_topk(**kw, backend="triton")
    logits = dsv4ops.paged_mqa_logits(kw["q"], kw["kv_cache"], kw["weights"], kw["context_lens"], kw["block_table"],
                                      kw["max_context_len"], backend="triton")
    want = dsv4ops.indexer_topk(logits, kw["topk"], seq_lens=kw["context_lens"], next_n=next_n, backend="triton")
    assert torch.equal(got.sort(1).values, want.sort(1).values)


def test_chunked_call_passes_the_conformance_rule(monkeypatch):
    monkeypatch.setattr(triton_paged_topk, "WORKSPACE_BYTES", 3 * 48 * 4)        # three rows per chunk
    case = make_case("paged_mqa_topk", B=4, next_n=2, context=40, H=8, block_size=16, topk=8, out=True)
    assert run_case(case, "triton", "cpu").status == "pass"


def test_the_logits_buffer_is_never_allocated(monkeypatch):
    """The workspace is one chunk's rows, not [B * next_n, max_context_len]."""
    kw = build_inputs("paged_mqa_topk", "cpu", G(), B=6, next_n=1, context=48, H=4, block_size=16, topk=8)
    monkeypatch.setattr(triton_paged_topk, "WORKSPACE_BYTES", 2 * kw["max_context_len"] * 4)
    sizes, empty = [], torch.empty

    def watch(*shape, **kwargs):
        t = empty(*shape, **kwargs)
        sizes.append(t.numel() * t.element_size())
        return t

    monkeypatch.setattr(triton_paged_topk.torch, "empty", watch)
    dsv4ops.paged_mqa_topk(**kw, backend="triton")
    assert max(sizes) <= 2 * kw["max_context_len"] * 4
