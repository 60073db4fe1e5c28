"""mqa_logits' own tests: the reference against loops (row chunks included). Its error inputs are
declared in its spec (test_errors.py), its layouts and aliases generated (test_strides.py)."""
import importlib

import pytest
import torch

import dsv4ops
from dsv4ops.conformance import build_inputs


# --- the reference against loops -------------------------------------------------------------

@pytest.mark.parametrize("ranges", ["causal", "requests", "random"])
def test_mqa_logits_matches_loops(gen, ranges, monkeypatch):
    """Loops in float64 over [ks, ke); -inf elsewhere; row chunks (forced small here) change only fp32 rounding."""
    module = importlib.import_module("dsv4ops.reference.impl.mqa_logits")      # the module, not the public function
    kw = build_inputs("mqa_logits", "cpu", gen, T=7, S=19, H=3, ranges=ranges)
    full = dsv4ops.reference.mqa_logits(**kw)
    monkeypatch.setattr(module, "CHUNK_ELEMENTS", 3 * 19 * 2)             # two rows per chunk
    torch.testing.assert_close(dsv4ops.reference.mqa_logits(**kw), full, rtol=1e-6, atol=1e-6)   # fp32 sum order
    for t in range(7):
        ks, ke = int(kw["ks"][t]), int(kw["ke"][t])
        assert bool((full[t, :ks] == float("-inf")).all() and (full[t, ke:] == float("-inf")).all())
        for s in range(ks, ke):
            k = kw["k"][s].double() * kw["k_scale"][s].item()
            want = sum(kw["weights"][t, h].item() * max(0.0, float(kw["q"][t, h].double() @ k)) for h in range(3))
            assert full[t, s].item() == pytest.approx(want, rel=1e-5, abs=1e-5)
