"""Put dsv4ops in vLLM: the attention class on the CPU and CUDA seams, the warm-up and the
graph-splitting ops. Every vLLM name comes from ``seams``. Imports vLLM.
"""
from __future__ import annotations

import functools
import importlib
from typing import Callable

import torch

import dsv4ops

from ...errors import ConfigError, UnsupportedError
from . import seams
from .routing import ROUTED_OPS, log


def install() -> None:
    from .attention import with_dsv4ops

    problems = seams.check_installed()
    if problems:
        raise ConfigError(f"dsv4ops' vLLM plugin does not fit this vLLM (docs/integration.md, supported versions): "
                          f"{'; '.join(problems)}. Set DSV4OPS_VLLM=0 to run vLLM without it.")
    _replace("cpu_attention_class", with_dsv4ops)
    if seams.installed_build() == seams.CUDA:
        _replace("gpu_attention_class", _selecting(with_dsv4ops))
        _replace("gpu_warmup", _followed_by_dsv4ops_warmup)
    _replace("splitting_ops", lambda ops: list(ops) + [f"dsv4ops::{op}" for op in ROUTED_OPS
                                                       if hasattr(torch.ops.dsv4ops, op) and f"dsv4ops::{op}" not in ops])


def _replace(name: str, make: Callable) -> None:
    """Seam ``name``'s object becomes ``make(object)`` where vLLM looks it up."""
    seam = seams.BY_NAME[name]
    owner = importlib.import_module(seam.module)
    *path, leaf = seam.qualname.split(".")
    for part in path:
        owner = getattr(owner, part)
    setattr(owner, leaf, make(getattr(owner, leaf)))


def _selecting(with_dsv4ops):
    def wrap(select):
        @functools.wraps(select)
        def select_dsv4ops(vllm_config):
            return with_dsv4ops(select(vllm_config))
        return select_dsv4ops
    return wrap


def _followed_by_dsv4ops_warmup(warmup):
    @functools.wraps(warmup)
    def warmup_with_dsv4ops(worker, *args, **kwargs):
        warmup(worker, *args, **kwargs)
        run_warmup(worker.vllm_config, getattr(worker, "device", None))
    return warmup_with_dsv4ops


def warmup_options(vllm_config) -> dict:
    """``dsv4ops.warmup`` keywords for the served model and vLLM's limits."""
    model = vllm_config.model_config.hf_config
    spec = vllm_config.speculative_config
    return dict(model="v4-pro" if getattr(model, "index_topk", 512) > 512 else "v4-flash",
                tp=vllm_config.parallel_config.tensor_parallel_size,
                limits=dict(max_tokens=vllm_config.scheduler_config.max_num_batched_tokens,
                            max_context=vllm_config.model_config.max_model_len,
                            next_n=1 + (spec.num_speculative_tokens if spec else 0)))


def run_warmup(vllm_config, device) -> None:
    """Compile the routed ops' kernel variants for this deployment before vLLM serves."""
    try:
        summary = dsv4ops.warmup(ROUTED_OPS, device=device, **warmup_options(vllm_config))
    except UnsupportedError as exc:                # the CPU: nothing compiles
        log.info("dsv4ops vLLM plugin: no warm-up on this device (%s)", exc)
        return
    log.info("dsv4ops vLLM plugin: warm-up %s", summary)
