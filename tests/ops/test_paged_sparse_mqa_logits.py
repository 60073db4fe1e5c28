"""paged_sparse_mqa_logits (docs/ops.md §15): the two-level indexer end to end. The source layer's
logits choose candidate blocks, the consumer's sparse logits over them feed indexer_topk, and the
positions mapped back are the top-k of the consumer's dense logits restricted to those blocks."""
import pytest
import torch
from helpers import assert_restricted_topk

import dsv4ops
from dsv4ops import formats
from dsv4ops.conformance import build_inputs
from dsv4ops.quant import to_fp8
from dsv4ops.rows import candidate_columns, decode_row_ends
from dsv4ops.tolerance import abs_index_cache, fp8_abs


def restricted(dense, blocks, sparse_block):
    """The dense logits with every position outside the row's candidate blocks set to -inf."""
    pos = candidate_columns(blocks, sparse_block)
    keep = torch.zeros(dense.shape[0], dense.shape[1] + 1, dtype=torch.bool)
    keep.scatter_(1, torch.where(pos >= 0, pos, dense.shape[1]).clamp(max=dense.shape[1]), True)
    return torch.where(keep[:, :-1], dense, float("-inf"))


@pytest.mark.parametrize("backend", ["reference", "triton"])
@pytest.mark.parametrize("next_n,lens_dim", [(1, 1), (2, 2), (4, 1)])
def test_two_level_composition_is_the_restricted_topk(backend, next_n, lens_dim):
    gen = torch.Generator().manual_seed(11)
    kw = build_inputs("paged_mqa_logits", "cpu", gen, B=3, next_n=next_n, context=120, H=8, block_size=16,
                      lens_dim=lens_dim)
    B, sparse_block, num_blocks, k = 3, 8, 6, 20
    width = kw["max_context_len"]
    source = dsv4ops.paged_mqa_logits(**{**kw, "q": to_fp8(torch.randn(B, next_n, 8, 128, generator=gen) * 3)},
                                      backend=backend)
    blocks, counts = dsv4ops.candidate_blocks(source, sparse_block, num_blocks, seq_lens=kw["context_lens"],
                                              next_n=next_n, backend=backend)
    sparse = dsv4ops.paged_sparse_mqa_logits(kw["q"], kw["kv_cache"], kw["weights"], kw["context_lens"],
                                             kw["block_table"], blocks, sparse_block, backend=backend)
    n = decode_row_ends(kw["context_lens"], next_n)
    lens = formats.candidate_lens(blocks, n, sparse_block)
    assert torch.equal((blocks >= 0).sum(1, dtype=torch.int32), counts)
    local = dsv4ops.indexer_topk(sparse, k, row_starts=torch.zeros_like(lens), row_ends=lens, backend=backend)
    positions = formats.candidate_positions(local, blocks, sparse_block)

    dense = dsv4ops.paged_mqa_logits(**kw, backend="reference")                    # the consumer, dense
    want = restricted(dense, blocks, sparse_block)
    kept = (want > float("-inf")).sum(1)
    assert torch.equal(kept, lens.long()) and bool((kept > 0).any())                # the valid columns: a prefix
    magnitude = dsv4ops.paged_mqa_logits(fp8_abs(kw["q"]), abs_index_cache(kw["kv_cache"]), kw["weights"].abs(),
                                         kw["context_lens"], kw["block_table"], width, backend="reference")
    assert_restricted_topk(want, positions, torch.zeros_like(n), k, 1e-4 * magnitude)
    assert bool((kept < k).any()) and bool((kept > k).any())          # rows shorter and longer than k


def test_mapping_helpers_by_hand():
    blocks = torch.tensor([[0, 3, 5, -1], [-1, -1, -1, -1]], dtype=torch.int32)
    local = torch.tensor([[0, 9, 17, 23, -1], [0, -1, 3, -1, -1]], dtype=torch.int32)
    assert formats.candidate_positions(local, blocks, 8).tolist() == [[0, 25, 41, 47, -1], [-1] * 5]
    assert formats.candidate_lens(blocks, torch.tensor([43, 0]), 8).tolist() == [19, 0]
