"""Tunables that change the algorithm a Triton kernel runs (not only its tile sizes) are conformance-
tested in every setting, not only the platform default."""
import pytest

import dsv4ops
from dsv4ops.conformance import cases, run_case
from dsv4ops.platform import default_device

TRITON = next(b for b in dsv4ops.backends() if b.name == "triton")
pytestmark = pytest.mark.skipif(not TRITON.available, reason=f"the Triton backend is not usable here: {TRITON.reason}")

TOPK = cases("indexer_topk", "quick")


@pytest.mark.parametrize("bits", [2, 4, 8])          # 1, bisection, is the default: the conformance suite
@pytest.mark.parametrize("case", TOPK, ids=[c.id for c in TOPK])
def test_topk_every_radix(env, bits, case):
    """Bisection (1 bit per step) and the histogram steps select the same columns, resident pieces
    and split rows included (the CPU tunables keep pieces small, so most cases split)."""
    env(DSV4OPS_TRITON_TUNING=f"topk_radix_bits={bits}")
    result = run_case(case, "triton", default_device(), seed=hash(case.id) % 10_000)
    assert result.status == "pass", f"{result.message}\nrerun: {result.reproducer()}"
