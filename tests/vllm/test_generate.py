"""DeepSeek-V4 generating through vLLM's CPU build, once on vLLM's own kernels and once with the dsv4ops
plugin on (reference backend; Triton through its interpreter), compared logit by logit on the same tokens.

The native run generates greedily; each plugin run is forced onto the native run's tokens (teacher
forcing, engine_run.py) and records the logits of every step. The prompts (conftest.prompt_lengths) reach
the sliding window, several ratio-128 blocks and the indexer's top-k, and the longest is prefilled in a
step where the others decode. logit_bound.py derives the bound from the ops' rules.
"""
from __future__ import annotations

import pytest
import torch

# A submodule, not "vllm": pytest puts tests/ on sys.path, where this folder passes for a namespace package.
pytest.importorskip("vllm.transformers_utils.configs.deepseek_v4")

from logit_bound import MARGIN_FACTOR, logit_bound  # noqa: E402
from tiny_checkpoint import CONFIG  # noqa: E402

NO_COUNTERS = "dsv4ops.integrations.vllm.routed_calls did not import in the engine's process"
# New tokens per prompt: the second prompt ends first, and the longest is then prefilled beside decodes.
NEW_TOKENS = [16, 4, 12, 8]
# name -> (environment, {prompt: new tokens}, routed ops the prompts do not reach). Triton's interpreter runs
# each kernel program by program in numpy (about 80 s for one layer's KV insert over 2,800 tokens), so
# Triton runs every op on the two short prompts (vLLM picks the top-k itself below the indexer's reach),
# and the indexer's decode op on the longest prompt, beside the reference backend.
PLUGIN_CONFIGS = {
    "reference": ({"DSV4OPS_BACKEND": "reference"}, dict(enumerate(NEW_TOKENS)), ()),
    "triton": ({"DSV4OPS_BACKEND": "triton"}, {0: 3, 1: 2}, ("paged_mqa_topk", "mqa_topk")),
    "triton-indexer": ({"DSV4OPS_BACKEND": "paged_mqa_topk=triton,*=reference"}, {3: 2}, ()),
}


@pytest.fixture(scope="module")
def native(engine_runs, prompts):
    return engine_runs("native", prompts, NEW_TOKENS, {})


@pytest.fixture(scope="module")
def routed_ops():
    from dsv4ops.integrations.vllm import routing
    return routing.ROUTED_OPS


@pytest.fixture(scope="module")
def bound(checkpoint):
    from safetensors.torch import load_file
    return logit_bound(load_file(str(checkpoint / "model.safetensors")), CONFIG)


def test_native_run_routes_nothing(native, routed_ops):
    assert native["routed_calls"] is not None, NO_COUNTERS
    assert not any(native["routed_calls"].get(op, 0) for op in routed_ops), native["routed_calls"]
    assert [len(t) for t in native["tokens"]] == NEW_TOKENS
    assert native["mixed_steps"] > 0, "no step decoded beside a prefill"


@pytest.mark.parametrize("config", list(PLUGIN_CONFIGS))
def test_plugin_logits_match_native(config, native, engine_runs, prompts, routed_ops, bound, tmp_path):
    env, new_tokens, unreached = PLUGIN_CONFIGS[config]
    chosen = list(new_tokens)
    forced = tmp_path / "native_tokens.pt"
    torch.save({"tokens": [native["tokens"][p][:new_tokens[p]] for p in chosen]}, forced)
    run = engine_runs(f"plugin-{config}", [prompts[p] for p in chosen], [new_tokens[p] for p in chosen],
                      {"DSV4OPS_VLLM": "1", **env}, forced=forced)

    calls = run["routed_calls"]
    assert calls is not None, NO_COUNTERS
    missing = [op for op in routed_ops if op not in unreached and calls.get(op, 0) == 0]
    assert not missing, f"routed ops that never ran through dsv4ops: {missing} (calls: {calls})"

    worst, checked_margins = 0.0, 0
    for got, got_tokens, p in zip(run["logits"], run["tokens"], chosen):
        n = new_tokens[p]
        ref, tokens = native["logits"][p][:n], native["tokens"][p][:n]
        assert got_tokens == tokens, f"prompt {p}: teacher forcing did not hold"
        assert torch.isfinite(got).all(), f"prompt {p}: non-finite logits"
        diff = (got - ref).abs().amax(dim=1)
        worst = max(worst, float(diff.max()))
        bad = torch.nonzero(diff > bound).flatten().tolist()
        assert not bad, (f"prompt {p} ({len(prompts[p])} tokens), steps {bad}: "
                         f"max |dlogit| {diff.max():.4g} > bound {bound:.4g}")
        top2 = ref.topk(2, dim=1).values
        decisive = (top2[:, 0] - top2[:, 1]) > MARGIN_FACTOR * bound
        checked_margins += int(decisive.sum())
        flipped = torch.nonzero(decisive & (got.argmax(1) != ref.argmax(1))).flatten().tolist()
        assert not flipped, f"prompt {p}: greedy token differs at steps {flipped} despite a decisive margin"
    print(f"\n{config}: max |dlogit| {worst:.4g}, bound {bound:.4g} ({worst / bound:.1%} of it); "
          f"greedy agreement required at {checked_margins} of {sum(new_tokens.values())} steps; calls {calls}")
