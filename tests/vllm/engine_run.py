"""One vLLM engine run, in a process of its own: ``python engine_run.py SPEC.json OUT.pt``.

SPEC holds the checkpoint folder, the prompts (token ids), the new tokens per prompt, the LLM
arguments and optionally a file of forced tokens (a previous run's OUT). Greedy generation; a logits
processor records every row of logits vLLM samples from and, when tokens are forced, replaces the
row with one that makes the forced token the greedy choice, so that this run sees exactly the token
sequence of the run it is compared with (teacher forcing). OUT: {"logits": [[steps, vocab] fp32 per
prompt], "tokens": [[ids] per prompt], "routed_calls": {op: calls} or None, "mixed_steps": steps in which some
requests were still prefilling while others decoded, "seconds": {...}}.
The engine runs in this process (VLLM_ENABLE_V1_MULTIPROCESSING=0) so that the processor and the
plugin's counters live here.
"""
from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import cpu_workarounds

cpu_workarounds.install()

import torch  # noqa: E402
from vllm.v1.sample.logits_processor import BatchUpdate, LogitsProcessor, MoveDirectionality  # noqa: E402

KEY = "dsv4ops_prompt"          # SamplingParams.extra_args key naming the prompt
RECORDED: dict[tuple[int, int], torch.Tensor] = {}   # (prompt, step) -> the row of logits
FORCED: list[list[int]] | None = None                 # per prompt, the token to force at each step
MIXED_STEPS = [0]                                     # steps that sampled prefilling and decoding requests


class TeacherForcing(LogitsProcessor):
    """Records each sampled row per (prompt, step = tokens generated so far) and forces FORCED's token.

    A request whose prefill is split over steps is sampled (and its token dropped) after each chunk:
    its rows overwrite one another and the last one, from the chunk that completes the prompt, stays.
    """

    def __init__(self, vllm_config, device, is_pin_memory):
        self.rows: dict[int, tuple[int, list[int]]] = {}     # batch row -> (prompt, its output ids)

    def is_argmax_invariant(self) -> bool:
        return False

    def update_state(self, batch_update: BatchUpdate | None):
        if batch_update is None:
            return
        for index in batch_update.removed:
            self.rows.pop(index, None)
        for index, params, _, output_ids in batch_update.added:
            self.rows[index] = (params.extra_args[KEY], output_ids)
        for a, b, direction in batch_update.moved:
            ra, rb = self.rows.pop(a, None), self.rows.pop(b, None)
            if ra is not None:
                self.rows[b] = ra
            if rb is not None and direction == MoveDirectionality.SWAP:
                self.rows[a] = rb

    def apply(self, logits: torch.Tensor) -> torch.Tensor:
        prefilling = sum(not output_ids for _, output_ids in self.rows.values())
        MIXED_STEPS[0] += 0 < prefilling < len(self.rows)
        for index, (prompt, output_ids) in self.rows.items():
            if index >= logits.shape[0]:
                continue
            step = len(output_ids)
            RECORDED[(prompt, step)] = logits[index].detach().clone()
            if FORCED is not None and step < len(FORCED[prompt]):
                logits[index] = float("-inf")
                logits[index, FORCED[prompt][step]] = 0.0
        return logits


def routed_calls() -> dict[str, int] | None:
    """The plugin's counters (None when dsv4ops.integrations.vllm or its routed_calls is missing)."""
    try:
        from dsv4ops.integrations.vllm import routed_calls as plugin_calls
    except ImportError:
        return None
    return dict(plugin_calls())


def main(spec_path: str, out_path: str):
    global FORCED
    from vllm import LLM, SamplingParams, TokensPrompt

    spec = json.loads(Path(spec_path).read_text())
    if spec.get("forced"):
        FORCED = torch.load(spec["forced"])["tokens"]
    start = time.perf_counter()
    llm = LLM(model=spec["checkpoint"], logits_processors=[TeacherForcing], **spec["llm"])
    started = time.perf_counter()
    calls_before = routed_calls()
    prompts = [TokensPrompt(prompt_token_ids=ids) for ids in spec["prompts"]]
    params = [SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True, detokenize=False,
                             extra_args={KEY: i}) for i, n in enumerate(spec["max_tokens"])]
    outputs = llm.generate(prompts, params, use_tqdm=False)
    done = time.perf_counter()
    tokens = [list(out.outputs[0].token_ids) for out in outputs]
    logits = [torch.stack([RECORDED[(i, s)] for s in range(len(t))]) for i, t in enumerate(tokens)]
    calls = routed_calls()
    if calls is not None and calls_before is not None:
        calls = {op: n - calls_before.get(op, 0) for op, n in calls.items()}
    torch.save({"logits": logits, "tokens": tokens, "routed_calls": calls, "mixed_steps": MIXED_STEPS[0],
                "seconds": {"init": started - start, "generate": done - started}}, out_path)


if __name__ == "__main__":
    main(*sys.argv[1:])
