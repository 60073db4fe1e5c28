"""The example decode step (dsv4ops.examples.decode_step) matches the all-reference pipeline."""
import pytest

import dsv4ops
from dsv4ops.examples.decode_step import compare_to_reference, make_layer
from dsv4ops.platform import default_device

SETTINGS = ["auto"] + [b.name for b in dsv4ops.backends() if b.available and b.name != "reference"]


@pytest.mark.parametrize("setting", SETTINGS)
def test_decode_step_matches_reference_pipeline(setting):
    layer = make_layer(T=3, H=8, context=700, index_topk=64, device=default_device())
    try:
        result = compare_to_reference(layer, setting)
    except dsv4ops.UnsupportedError as exc:               # e.g. triton on CPU without the interpreter
        pytest.skip(str(exc))
    assert result["topk_overlap"] >= 0.95, result         # near-ties may be broken differently
    assert result["attn_diff"] < 1e-4 and result["z_diff"] < 1e-3, result
