"""candidate_blocks (docs/ops.md §14): the reference against a per-row loop written from the
contract, and the Triton selection on hand-built rows (ties, NaN, the forced block, -inf blocks)."""
import math

import pytest
import torch

import dsv4ops
from dsv4ops.conformance import build_inputs, make_case, run_case
from dsv4ops.rows import row_bounds


def _by_contract(logits, start, n, block, num_blocks):
    """One row, plain Python: block score = max of visible logits (NaN wins), ranked NaN > +inf >
    ... with the newest block first, ties to the lower block, -inf dropped; ascending."""
    ranked = []
    for b in range(math.ceil(n / block)):
        vals = [float(logits[start + p]) for p in range(b * block, min(n, (b + 1) * block))]
        score = float("nan") if any(math.isnan(v) for v in vals) else max(vals)
        forced = b == (n - 1) // block
        if score == float("-inf") and not forced:
            continue
        rank = (2 if forced else 1 if math.isnan(score) else 0, 0.0 if math.isnan(score) else score)
        ranked.append((rank, -b, b))
    kept = sorted(b for _, _, b in sorted(ranked, reverse=True)[:num_blocks])
    return kept + [-1] * (num_blocks - len(kept)), len(kept)


@pytest.mark.parametrize("params", [
    dict(R=6, W=90, num_blocks=5, data="ties"), dict(R=6, W=90, num_blocks=5, data="nonfinite"),
    dict(R=6, W=90, num_blocks=5, data="neg_inf"), dict(R=6, W=77, sparse_block=3, num_blocks=40),
    dict(R=8, W=64, num_blocks=3, mode="decode1d", next_n=4, data="ties")])
def test_reference_matches_the_contract_loop(params):
    kw = build_inputs("candidate_blocks", "cpu", torch.Generator().manual_seed(3), **params)
    blocks, counts = dsv4ops.candidate_blocks(**kw, backend="reference")
    starts, ends = row_bounds(kw.get("row_starts"), kw.get("row_ends"), kw.get("seq_lens"), kw.get("next_n", 1))
    for r in range(kw["logits"].shape[0]):
        want, count = _by_contract(kw["logits"][r], int(starts[r]), int(ends[r] - starts[r]),
                                   kw["sparse_block"], kw["num_blocks"])
        assert blocks[r].tolist() == want and int(counts[r]) == count, r


def _rows(*rows):
    return torch.tensor(rows, dtype=torch.float32)


@pytest.mark.parametrize("backend", ["reference", "triton"])
def test_hand_built_rows(backend):
    """Block size 2, two blocks kept. Row 0: ties (blocks 0, 1, 2 score 5) -> the lower ones, but the
    newest block (3) is forced in. Row 1: a NaN block outranks +inf. Row 2: -inf blocks dropped
    (only the forced one and one finite block remain). Row 3: -0 and +0 tie."""
    inf, nan = float("inf"), float("nan")
    logits = _rows([5, 1, 5, 2, 1, 5, 0, -1],
                   [1, inf, nan, 0, 3, 2, 4, 0],
                   [-inf, -inf, 1, -inf, -inf, -inf, -inf, 0],
                   [-0.0, -0.0, 0, -1, -0.0, -2, -3, -3])
    R = logits.shape[0]
    starts, ends = torch.zeros(R, dtype=torch.int32), torch.full((R,), 7, dtype=torch.int32)
    blocks, counts = dsv4ops.candidate_blocks(logits, 2, 2, row_starts=starts, row_ends=ends, backend=backend)
    assert blocks.tolist() == [[0, 3], [1, 3], [1, 3], [0, 3]]
    assert counts.tolist() == [2, 2, 2, 2]
    blocks, counts = dsv4ops.candidate_blocks(logits, 2, 8, row_starts=starts, row_ends=ends, backend=backend)
    assert blocks[2].tolist() == [1, 3] + [-1] * 6 and counts.tolist() == [4, 4, 2, 4]


@pytest.mark.parametrize("params", [dict(R=5, W=300, num_blocks=7, data="ties", mode="decode2d", next_n=5),
                                    dict(R=3, W=1100, num_blocks=70, data="ties"),
                                    dict(R=4, W=2000, sparse_block=1, num_blocks=300, data="ties")])
def test_triton_across_tiles(params):
    """Rows longer than one tile of blocks (the threshold's ties split across tiles)."""
    assert run_case(make_case("candidate_blocks", **params), "triton", "cpu").status == "pass"
