"""mqa_logits' own tests: the reference against loops (row chunks included); the overlaps and the
zero-head call issue 23 found accepted. Its error inputs are declared in its spec (test_errors.py),
its layouts and aliases generated (test_strides.py)."""
import importlib

import pytest
import torch
from helpers import G, raises_input_error

import dsv4ops
from dsv4ops.conformance import build_inputs
from dsv4ops.conformance.strides import aliased
from dsv4ops.ops import OPS

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


# --- overlapping arguments and zero heads (issue 23: each was accepted once) ---------------------

def test_out_is_weights():
    """The user's call: ``out=weights`` ran and overwrote ``weights``; now an InputError naming
    ``out``, on the default dispatch and every backend, with nothing written."""
    kw = build_inputs("mqa_logits", "cpu", G(), T=4, S=16, H=16, ranges="causal")
    kw["out"] = kw["weights"]
    weights = kw["weights"].clone()
    with pytest.raises(dsv4ops.InputError, match="mqa_logits: argument 'out'.*must not overlap 'weights'"):
        dsv4ops.mqa_logits(**kw)
    assert torch.equal(kw["weights"], weights)
    raises_input_error("mqa_logits", kw, "out", "must not overlap 'weights'")


@pytest.mark.parametrize("other", ["k_scale", "ke"])
def test_out_overlapping(other):
    """``out`` sharing bytes with ``k_scale`` (Triton wrote NaN into the valid logits) or ``ke``
    (accepted)."""
    kw = aliased(build_inputs("mqa_logits", "cpu", G(), T=4, S=16, H=16, ranges="causal", out=True), "out", other)
    raises_input_error("mqa_logits", kw, "out", f"must not overlap '{other}'")


def test_zero_heads():
    """H = 0 (validation once accepted it and the reference crashed reshaping 0 elements): an
    InputError naming ``q``, from the reference's own entry point too."""
    kw = build_inputs("mqa_logits", "cpu", G(), T=4, S=16, H=16, ranges="causal")
    kw["q"], kw["weights"] = kw["q"][:, :0], kw["weights"][:, :0]
    raises_input_error("mqa_logits", kw, "q", "at least one head")
    with pytest.raises(dsv4ops.InputError, match="mqa_logits: argument 'q'"):
        dsv4ops.reference.mqa_logits(**kw)


# Contract decision (docs/ops.md): what this input produces, or that it raises.
@pytest.mark.parametrize("backend", ["reference", "triton"])
def test_mqa_logits_scales_of_uncovered_keys_are_not_read(backend):
    """§11: k_scale must be finite and > 0 on the keys some row's [ks, ke) covers; the others (the
    builder makes them NaN) are never read, so 0 or -1 there is fine and changes nothing."""
    kw = build_inputs("mqa_logits", "cpu", torch.Generator().manual_seed(11), T=6, S=40, H=8, ranges="random", clean=True)
    uncovered = kw["k_scale"].isnan()
    assert uncovered.any()
    want = dsv4ops.mqa_logits(**kw, backend="reference")
    zeroed = dict(kw, k_scale=torch.where(uncovered, -1.0, kw["k_scale"]))
    got = dsv4ops.mqa_logits(**zeroed, backend=backend)
    assert OPS["mqa_logits"].spec.conformance.compare({}, kw, want, zeroed, got).ok
    covered = int((~uncovered).nonzero()[0])
    with pytest.raises(dsv4ops.InputError, match="'k_scale'.*covers.*finite and > 0"):
        dsv4ops.mqa_logits(**dict(zeroed, k_scale=torch.where(torch.arange(40) == covered, 0.0, zeroed["k_scale"])),
                           backend=backend)
