"""The examples (dsv4ops.examples.decode_step, dsv4ops.examples.layer) match the all-reference pipeline."""
from dataclasses import replace

import pytest

import dsv4ops
from dsv4ops.examples import layer as layer_example
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


# The layer example (dsv4ops.examples.layer) at CPU sizes: C4 prompts of 45 and 37 tokens in chunks of
# 30 (windows straddle the chunks; the top-k drops entries), C128 prompts of 128 and 9 (an entry
# completed at the end of the prefill and read by the decode steps); two decode steps each.
LAYER_SIZES = {4: replace(layer_example.TINY, prompts=(45, 37), chunk=30),
               128: replace(layer_example.TINY, prompts=(128, 9), chunk=100)}
_LAYERS = {}


@pytest.mark.parametrize("setting", ["auto", "triton"])
@pytest.mark.parametrize("ratio", [4, 128])
def test_layer_matches_reference_pipeline(ratio, setting):
    if ratio not in _LAYERS:                    # built once: the reference run is kept on the layer
        _LAYERS[ratio] = layer_example.make_layer(ratio, LAYER_SIZES[ratio], default_device())
    layer = _LAYERS[ratio]
    try:
        report = layer_example.compare(layer, setting)
    except dsv4ops.UnsupportedError as exc:               # e.g. triton on CPU without the interpreter
        pytest.skip(str(exc))
    assert report["ok"], "\n".join(layer_example.format_report(layer, setting, report))
    assert {kind for kind in report["phases"]} == {"prefill", "decode"}
    stages = {op for _, op in report["stages"]}
    assert {"qnorm_rope_kv_insert", "compress_kv_insert", "sparse_mla_prefill", "sparse_mla_decode",
            "inv_rope_fp8_quant", "fp8_einsum"} <= stages
    if ratio == 4:
        assert {"mqa_logits", "paged_mqa_logits", "indexer_topk"} <= stages
