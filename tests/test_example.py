"""The examples (dsv4ops.examples.decode_step, dsv4ops.examples.layer) match the all-reference pipeline."""
from dataclasses import replace

import pytest
import torch
from helpers import model_entries

import dsv4ops
from dsv4ops import formats
from dsv4ops.examples import layer as layer_example
from dsv4ops.examples import layer41
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
# On a GPU: longer prompts (C4 with more entries than the top-k keeps; C128 entries completed in the
# prefill and by a decode step) and V4's widths (window 128, C128 lists of 128, 64 heads and indexer
# heads), which the vendor kernels require, so that "auto" runs them.
CPU_LAYER_SIZES = {4: replace(layer_example.TINY, prompts=(45, 37), chunk=30),
                   128: replace(layer_example.TINY, prompts=(128, 9), chunk=100)}
LAYER_SIZES = CPU_LAYER_SIZES
if default_device().type == "cuda":
    LAYER_SIZES = {r: replace(CPU_LAYER_SIZES[r], prompts=prompts, chunk=256, window=128, c128_align=128, heads=64,
                              index_heads=64, index_topk=64)
                   for r, prompts in ((4, (700, 301)), (128, (600, 255)))}
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
    assert report["ok"], "\n".join(layer_example.format_report(layer, report))
    assert {kind for kind in report["phases"]} == {"prefill", "decode"}
    stages = {op for _, op in report["stages"]}
    assert {"qnorm_rope_kv_insert", "compress_kv_insert", "sparse_mla_prefill", "sparse_mla_decode",
            "inv_rope_fp8_quant", "fp8_einsum"} <= stages
    if ratio == 4:
        assert {"mqa_logits", "paged_mqa_logits", "indexer_topk"} <= stages


def test_layer_engine_side_metadata_matches_the_model():
    """What the example computes outside dsv4ops, checked on the reference run: the compressed
    entries (both compressors, over chunks and decode steps) equal the model's whole-sequence
    formulation; the keys gathered for mqa_logits give paged_mqa_logits' scores over the cache;
    the SWA and C128 lists hold exactly the slots of the window and of the entries so far."""
    for ratio in (4, 128):
        layer = layer_example.make_layer(ratio, CPU_LAYER_SIZES[ratio])
        outputs, caches, _ = layer_example.run_layer(layer, "reference")
        steps, tables = layer.steps, layer.tables
        acts = [layer_example.activations(layer, step) for step in steps]
        for r, length in enumerate(layer.sizes.prompts):
            rows = lambda name: torch.cat([getattr(x, name)[s.token_to_req == r] for s, x in zip(steps, acts)])
            n = (length + layer.sizes.decode_steps) // ratio
            entries = torch.arange(n)
            slots = layer_example.entry_slots(tables["comp"], torch.full_like(entries, r), entries, layer.comp_block)
            want = model_entries(rows("comp_kv"), rows("comp_score"), layer.compressor["ape"],
                                 layer.compressor["norm_weight"], 1e-6, ratio, layer.cos_sin)
            got = formats.read_kv(caches["comp"], "fp8_ds_mla", layer.comp_block, slots)
            expect = formats.allocate_kv_cache(max(1, -(-n // 64)), 64, "fp8_ds_mla")
            formats.write_kv(expect, "fp8_ds_mla", 64, entries, want)
            torch.testing.assert_close(got, formats.read_kv(expect, "fp8_ds_mla", 64, entries), rtol=2 ** -3, atol=1e-6)
            if ratio == 4:
                want = model_entries(rows("index_kv"), rows("index_score"), layer.indexer["ape"],
                                     layer.indexer["norm_weight"], 1e-6, 4, layer.cos_sin)
                keys = formats.unpack_index_keys(caches["index"])
                index = layer_example.entry_slots(tables["index"], torch.full_like(entries, r), entries, 64)
                packed = formats.unpack_index_keys(formats.pack_index_keys(want[None], "ue8m0"))[0]
                torch.testing.assert_close(keys[index // 64, index % 64], packed, rtol=2 ** -3, atol=1e-6)
        for step, m, x in zip(steps, layer.meta, acts):
            p, req = step.positions, step.token_to_req.long()
            for t in range(len(p)):
                window = torch.arange(max(0, int(p[t]) - layer.sizes.window + 1), int(p[t]) + 1)
                want = layer_example.entry_slots(tables["swa"], req[t].expand(len(window)), window, 64)
                assert m.swa_idx[t, : m.swa_lens[t]].tolist() == want.tolist()
                if ratio == 128:
                    e = torch.arange(int(p[t] + 1) // 128)
                    want = layer_example.entry_slots(tables["comp"], req[t].expand(len(e)), e, 2)
                    assert m.extra_idx[t, : m.extra_lens[t]].tolist() == want.tolist()
            if ratio == 4 and step.kind == "prefill":
                values, scales = formats.index_key_views(caches["index"])
                keys = values.view(torch.uint8)[m.key_page, m.key_offset].view(values.dtype)
                gathered = dsv4ops.mqa_logits(x.index_q, keys, scales[m.key_page, m.key_offset], x.index_weights,
                                              m.ks, m.ke, backend="reference")
                n = (m.ke - m.ks)[:, None]
                paged = dsv4ops.paged_mqa_logits(x.index_q[:, None], caches["index"], x.index_weights, n,
                                                  tables["index"][req], tables["index"].shape[1] * 64,
                                                  backend="reference")
                for t in range(len(p)):
                    torch.testing.assert_close(gathered[t, m.ks[t]:m.ke[t]], paged[t, : n[t, 0]])


# The V4.1 stack (dsv4ops.examples.layer41): two ratio-2 layers sharing a compressed cache and a top-k,
# two ratio-1 layers sharing one and the candidate blocks of the two-level indexer; 528 / 288 / 68 B
# caches; a decode step verifies 5 tokens per request. On the CPU prompts of 37 and 21 tokens in
# chunks of 24 (the 16 candidate positions leave out some of L20's entries); on a GPU V4.1's widths.
V41_SIZES = replace(layer41.TINY, prompts=(37, 21), chunk=24, decode_steps=1)
if default_device().type == "cuda":
    V41_SIZES = replace(layer41.TINY, prompts=(700, 301), chunk=256, heads=64, index_heads=32, index_topk=64,
                        window=128, candidate_blocks=16, candidate_block=8, o_rank=256)
_STACK = []


@pytest.mark.parametrize("setting", ["auto", "triton"] if default_device().type == "cuda" else ["triton"])
def test_v41_stack_matches_reference_pipeline(setting):
    if not _STACK:                              # built once: the reference run is kept on the stack
        _STACK.append(layer41.make_stack(V41_SIZES, default_device()))
    stack = _STACK[0]
    assert max(V41_SIZES.prompts) > V41_SIZES.candidate_blocks * V41_SIZES.candidate_block   # candidates restrict
    try:
        report = layer41.compare(stack, setting)
    except dsv4ops.UnsupportedError as exc:               # e.g. triton on CPU without the interpreter
        pytest.skip(str(exc))
    assert report["ok"], "\n".join(layer41.format_report(report))
    assert {kind for _, kind in report["phases"]} == {"prefill", "decode"}
    stages = {op for _, op in report["stages"]}
    assert {"qnorm_rope_kv_insert", "compress_kv_insert", "paged_mqa_logits", "indexer_topk", "candidate_blocks",
            "paged_sparse_mqa_logits", "sparse_mla_prefill", "sparse_mla_decode", "inv_rope_fp8_quant",
            "fp8_einsum"} <= stages
