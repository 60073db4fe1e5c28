"""CUDA-graph safety: capture the example decode steps (decode_step's, and the layer example's after
a prefill), replay them on new input values, and compare with an eager run on those values (no host
sync, no allocation that changes between replays)."""
from dataclasses import replace

import pytest
import torch

from dsv4ops.examples import layer as layer_example
from dsv4ops.examples.common import backend_setting
from dsv4ops.examples.decode_step import make_layer, run_step

pytestmark = pytest.mark.gpu
SETTINGS = ["auto", "triton"]


@pytest.mark.parametrize("setting", SETTINGS)
def test_captured_decode_step_replays(setting):
    layer = make_layer(T=8, H=64, context=2048, index_topk=512, device="cuda")
    run_step(layer, setting)                                   # warm-up: compilation, probes, decisions
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = run_step(layer, setting)
    for seed in (1, 2):
        fresh = make_layer(T=8, H=64, context=2048, index_topk=512, device="cuda", seed=seed)
        for name in ("q", "kv", "index_q", "index_weights", "attn_sink"):
            getattr(layer, name).copy_(getattr(fresh, name))      # new values in the captured buffers
        graph.replay()
        torch.cuda.synchronize()
        eager = run_step(layer, setting)
        for key in ("q", "topk", "attn", "z"):
            assert torch.equal(captured[key], eager[key]), (setting, seed, key)


@pytest.mark.parametrize("setting", SETTINGS)
@pytest.mark.parametrize("ratio", [4, 128])
def test_captured_layer_decode_step_replays(ratio, setting):
    """The layer example's decode step (compressor and inv_rope_fp8_quant included) after a prefill:
    captured once, replayed on new projection outputs, equal to an eager run on them."""
    sizes = replace(layer_example.TINY, prompts=(300, 131), chunk=256, heads=64, index_heads=64, index_topk=64,
                    window=128, c128_align=128)              # V4's list widths: the vendor kernels take them
    layer = layer_example.make_layer(ratio, sizes, "cuda")
    caches = {name: cache.clone() for name, cache in layer.caches.items()}
    op = layer_example.Runner(judge=False)
    *earlier, step = layer.steps
    with backend_setting(setting):
        for s in earlier:
            layer_example.run_step(layer, s, layer_example.activations(layer, s), caches, op)
        x = layer_example.activations(layer, step)
        layer_example.run_step(layer, step, x, caches, op)          # warm-up
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            captured = layer_example.run_step(layer, step, x, caches, op)
        for seed in (1, 2):
            fresh = layer_example.activations(layer, replace(step, number=step.number + 1000 * seed))

            def load_fresh():                                       # new values in the captured buffers
                for name, value in vars(fresh).items():
                    getattr(x, name).copy_(value)
            load_fresh()
            graph.replay()
            torch.cuda.synchronize()
            load_fresh()                    # the step normalizes and ropes x.q in place: the same inputs again
            eager = layer_example.run_step(layer, step, x, caches, op)
            for key in ("attn", "z", "topk"):
                if eager[key] is not None:
                    assert torch.equal(captured[key], eager[key]), (setting, seed, key)
