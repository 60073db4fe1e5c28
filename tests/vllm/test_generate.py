"""DeepSeek-V4 generating through vLLM's CPU build, once on vLLM's own kernels and once with the dsv4ops
plugin on (reference backend; Triton through its interpreter), compared logit by logit on the same tokens.

The native run generates greedily; each plugin run is forced onto the native run's tokens (teacher
forcing, engine_run.py) and records the logits of every step. The prompts (conftest.prompt_lengths) reach
the sliding window, several ratio-128 blocks and the indexer's top-k, and the longest is prefilled in
chunks while the others decode. logit_bound.py derives the bound from the ops' rules.
"""
from __future__ import annotations

import pytest
import torch

# A submodule, not "vllm": pytest puts tests/ on sys.path, where this folder passes for a namespace package.
pytest.importorskip("vllm.transformers_utils.configs.deepseek_v4")

from logit_bound import MARGIN_FACTOR, logit_bound  # noqa: E402
from tiny_checkpoint import CONFIG  # noqa: E402

NO_COUNTERS = "dsv4ops.integrations.vllm.routed_calls did not import in the engine's process"
NEW_TOKENS = [16, 12, 12, 8]
# Triton's interpreter runs every kernel in numpy: fewer steps, the indexer still reached by the long prompt.
PLUGIN_CONFIGS = {
    "reference": ({"DSV4OPS_BACKEND": "reference"}, NEW_TOKENS),
    "triton": ({"DSV4OPS_BACKEND": "triton"}, [4, 3, 3, 2]),
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


@pytest.mark.parametrize("backend", list(PLUGIN_CONFIGS))
def test_plugin_logits_match_native(backend, native, engine_runs, prompts, routed_ops, bound, tmp_path):
    env, new_tokens = PLUGIN_CONFIGS[backend]
    forced = tmp_path / "native_tokens.pt"
    torch.save({"tokens": [t[:n] for t, n in zip(native["tokens"], new_tokens)]}, forced)
    run = engine_runs(f"plugin-{backend}", prompts, new_tokens, {"DSV4OPS_VLLM": "1", **env}, forced=forced)

    calls = run["routed_calls"]
    assert calls is not None, NO_COUNTERS
    missing = [op for op in routed_ops if calls.get(op, 0) == 0]
    assert not missing, f"routed ops that never ran through dsv4ops: {missing} (calls: {calls})"

    worst, checked_margins = 0.0, 0
    for prompt, (got, ref, tokens, n) in enumerate(zip(run["logits"], native["logits"], native["tokens"], new_tokens)):
        assert run["tokens"][prompt] == tokens[:n], f"prompt {prompt}: teacher forcing did not hold"
        ref = ref[:n]
        diff = (got - ref).abs().amax(dim=1)
        worst = max(worst, float(diff.max()))
        assert torch.isfinite(got).all(), f"prompt {prompt}: non-finite logits"
        bad = torch.nonzero(diff > bound).flatten().tolist()
        assert not bad, (f"prompt {prompt} ({len(prompts[prompt])} tokens), steps {bad}: "
                         f"max |dlogit| {diff.max():.4g} > bound {bound:.4g}")
        top2 = ref.topk(2, dim=1).values
        decisive = (top2[:, 0] - top2[:, 1]) > MARGIN_FACTOR * bound
        checked_margins += int(decisive.sum())
        flipped = torch.nonzero(decisive & (got.argmax(1) != ref.argmax(1))).flatten().tolist()
        assert not flipped, f"prompt {prompt}: greedy token differs at steps {flipped} despite a decisive margin"
    print(f"\n{backend}: max |dlogit| {worst:.4g}, bound {bound:.4g} ({worst / bound:.1%} of it); "
          f"greedy agreement required at {checked_margins} of {sum(new_tokens)} steps; calls {calls}")
