"""sparse_mqa_logits (docs/ops.md §16): the two-level indexer's prefill form end to end, blocks
relative to each row's ks: candidate blocks from the source layer's mqa_logits, sparse logits,
indexer_topk, positions mapped back = the top-k of the dense logits restricted to the blocks."""
import pytest
import torch
from helpers import assert_restricted_topk

import dsv4ops
from dsv4ops import formats
from dsv4ops.conformance import build_inputs
from dsv4ops.quant import to_fp8
from dsv4ops.rows import candidate_columns
from dsv4ops.tolerance import fp8_abs


@pytest.mark.parametrize("backend", ["reference", "triton"])
@pytest.mark.parametrize("ranges", ["causal", "requests"])
def test_two_level_composition_is_the_restricted_topk(backend, ranges):
    gen = torch.Generator().manual_seed(7)
    kw = build_inputs("mqa_logits", "cpu", gen, T=12, S=160, H=8, ranges=ranges)
    T, S = 12, 160
    sparse_block, num_blocks, k = 8, 5, 16
    source = dsv4ops.mqa_logits(**{**kw, "q": to_fp8(torch.randn(T, 8, 128, generator=gen) * 3)}, backend=backend)
    blocks, _ = dsv4ops.candidate_blocks(source, sparse_block, num_blocks, row_starts=kw["ks"], row_ends=kw["ke"],
                                         backend=backend)
    sparse = dsv4ops.sparse_mqa_logits(kw["q"], kw["k"], kw["k_scale"], kw["weights"], kw["ks"], kw["ke"], blocks,
                                       sparse_block, backend=backend)
    n = (kw["ke"] - kw["ks"]).long()
    lens = formats.candidate_lens(blocks, n, sparse_block)
    local = dsv4ops.indexer_topk(sparse, k, row_starts=torch.zeros_like(lens), row_ends=lens, backend=backend)
    positions = formats.candidate_positions(local, blocks, sparse_block)            # relative to ks

    dense = dsv4ops.mqa_logits(**kw, backend="reference")
    pos = candidate_columns(blocks, sparse_block)
    absolute = torch.where((pos >= 0) & (pos < n[:, None]), kw["ks"].long()[:, None] + pos, S)
    keep = torch.zeros(T, S + 1, dtype=torch.bool).scatter_(1, absolute, True)[:, :S]
    want = torch.where(keep, dense, float("-inf"))
    assert torch.equal(keep.sum(1), lens.long()) and bool((lens > 0).any())
    magnitude = dsv4ops.mqa_logits(fp8_abs(kw["q"]), fp8_abs(kw["k"]), kw["k_scale"].abs(), kw["weights"].abs(),
                                   kw["ks"], kw["ke"], backend="reference")
    assert_restricted_topk(want, positions, kw["ks"], k, 1e-4 * magnitude)
    assert bool((lens < k).any()) and bool((lens > k).any())          # rows shorter and longer than k
