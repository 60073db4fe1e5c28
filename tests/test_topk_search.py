"""The Triton top-k's resident search (``_kth_largest``) on whole rows held by one program, for logit
distributions that stress an interpolated search: heavy tails spanning many binades, bf16-rounded
values (long runs of equal keys), few distinct values, ``-inf`` padding, and ``k`` equal to the
number of valid columns. Each against the reference through the conformance comparison."""
import pytest

import dsv4ops
from dsv4ops.conformance import run_case
from dsv4ops.conformance.cases import make_case

TRITON = any(b.name == "triton" and b.available for b in dsv4ops.backends())


@pytest.mark.skipif(not TRITON, reason="the Triton backend is not available here")
@pytest.mark.parametrize("data", ["random", "heavy_tail", "bf16", "ties", "neg_inf"])
@pytest.mark.parametrize("W,k", [(2048, 64), (1024, 512), (700, 1024)], ids=["2048-64", "1024-512", "k>W"])
def test_resident_rows_match_the_reference(env, data, W, k):
    """One resident program per row (``topk_resident`` = W rounded up), so the search runs over the
    whole row; rows of random length, some empty."""
    env(DSV4OPS_TRITON_TUNING="topk_resident=2048,topk_min_piece=4096")      # no split
    case = make_case("indexer_topk", R=3, W=W, k=k, mode="ranges", data=data, corner="empty")
    result = run_case(case, "triton", "cpu", seed=5)
    assert result.status == "pass", f"{result.message}\nrerun: {result.reproducer()}"
