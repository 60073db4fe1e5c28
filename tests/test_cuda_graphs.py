"""CUDA-graph safety: capture the example decode step, replay it on new input values, and compare
with an eager run on those values (no host sync, no allocation that changes between replays)."""
import pytest
import torch

from dsv4ops.examples.decode_step import make_layer, run_step

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
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
