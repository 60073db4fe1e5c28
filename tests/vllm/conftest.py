"""The vLLM lane's fixtures: a tiny DeepSeek-V4 checkpoint, the prompts, and engine runs in processes of
their own (tests/vllm/engine_run.py; one engine per process, with vLLM's CPU workarounds installed there).
Every test module here skips when vLLM is not installed (the main suites do not install it); this file
imports no vLLM."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from tiny_checkpoint import CONFIG, INDEXER_REACH, WINDOW, write_checkpoint

HERE = Path(__file__).resolve().parent
C128_BLOCK = 128
ENGINE_ENV = {
    "TRITON_INTERPRET": "1",                   # vLLM's metadata kernels (cpu_workarounds.py) and dsv4ops' Triton
    "VLLM_ENABLE_V1_MULTIPROCESSING": "0",     # the engine in the run's process: logits and counters readable
    "VLLM_USE_V2_MODEL_RUNNER": "0",           # the runner the CPU path was measured with
    "VLLM_CPU_KVCACHE_SPACE": "1",             # GiB
}
# vLLM's CPU platform turns chunked prefill off for MLA models, so a prefill shares a step with decodes when
# a request is admitted late: with 3 sequences at a time, the 4th prompt (the longest) waits until the
# second one finishes and is then prefilled beside the other two's decodes (test_generate.NEW_TOKENS).
LLM_ARGS = dict(dtype="bfloat16", enforce_eager=True, max_model_len=4096, max_num_seqs=3, seed=0,
                skip_tokenizer_init=True, async_scheduling=False)


def prompt_lengths() -> list[int]:
    """A short prompt; longer than the window; than several ratio-128 blocks; than the indexer's reach."""
    return [9, WINDOW + 72, 5 * C128_BLOCK + 60, INDEXER_REACH + 252]


@pytest.fixture(scope="session")
def checkpoint(tmp_path_factory) -> Path:
    return write_checkpoint(tmp_path_factory.mktemp("dsv4-tiny"), seed=0)


@pytest.fixture(scope="session")
def prompts() -> list[list[int]]:
    gen = torch.Generator().manual_seed(7)
    special = 2                                     # ids 0 and 1 are BOS and EOS
    return [torch.randint(special, CONFIG["vocab_size"], (n,), generator=gen).tolist() for n in prompt_lengths()]


def run_engine(folder: Path, name: str, checkpoint: Path, prompts, max_tokens, env: dict, forced: Path | None = None):
    """Run engine_run.py in a fresh process with ``env`` (DSV4OPS_* taken only from it); returns its
    result dict. The process's log is printed when it fails."""
    spec = folder / f"{name}.json"
    out = folder / f"{name}.pt"
    spec.write_text(json.dumps({"checkpoint": str(checkpoint), "prompts": prompts, "max_tokens": max_tokens,
                                "llm": LLM_ARGS, "forced": str(forced) if forced else None}))
    full_env = {k: v for k, v in os.environ.items() if not k.startswith("DSV4OPS_")} | ENGINE_ENV | env
    start = time.perf_counter()
    proc = subprocess.run([sys.executable, str(HERE / "engine_run.py"), str(spec), str(out)], env=full_env,
                          cwd=HERE, capture_output=True, text=True, timeout=900)
    if proc.returncode != 0:
        pytest.fail(f"engine run {name} exited {proc.returncode}:\n{(proc.stdout + proc.stderr)[-6000:]}")
    result = torch.load(out)
    result["seconds"]["process"] = time.perf_counter() - start
    print(f"\n{name}: {', '.join(f'{k} {v:.1f} s' for k, v in result['seconds'].items())}")
    return result


@pytest.fixture(scope="session")
def engine_runs(tmp_path_factory, checkpoint):
    folder = tmp_path_factory.mktemp("engine-runs")
    return lambda name, *args, **kwargs: run_engine(folder, name, checkpoint, *args, **kwargs)
