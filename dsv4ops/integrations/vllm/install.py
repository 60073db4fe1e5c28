"""Put dsv4ops in vLLM: the attention class on the CPU and CUDA seams, the warm-up and the
graph-splitting ops. Every vLLM name comes from ``seams``. Imports vLLM.
"""
from __future__ import annotations

import functools
import importlib

import torch

import dsv4ops

from ...errors import UnsupportedError
from . import seams
from .routing import ROUTED_OPS, log


def install() -> None:
    from .attention import with_dsv4ops

    problems = seams.check_installed()
    if problems:
        log.warning("dsv4ops vLLM plugin: seams moved in this vLLM: %s", "; ".join(problems))
    cpu_model = importlib.import_module(seams.BY_NAME["cpu_attention_class"].module)
    cpu_model.DeepseekV4CPUAttention = with_dsv4ops(seams.resolve("cpu_attention_class"))
    if seams.installed_build() == seams.CUDA:
        _wrap_gpu_attention_class(with_dsv4ops)
        _wrap_gpu_warmup()
    _add_splitting_ops()


def _wrap_gpu_attention_class(with_dsv4ops) -> None:
    seam = seams.BY_NAME["gpu_attention_class"]
    module = importlib.import_module(seam.module)
    select = seams.resolve(seam.name)

    @functools.wraps(select)
    def select_dsv4ops(vllm_config):
        return with_dsv4ops(select(vllm_config))

    setattr(module, seam.qualname, select_dsv4ops)


def _wrap_gpu_warmup() -> None:
    seam = seams.BY_NAME["gpu_warmup"]
    module = importlib.import_module(seam.module)
    warmup = seams.resolve(seam.name)

    @functools.wraps(warmup)
    def warmup_with_dsv4ops(worker, *args, **kwargs):
        warmup(worker, *args, **kwargs)
        run_warmup(worker.vllm_config, getattr(worker, "device", None))

    setattr(module, seam.qualname, warmup_with_dsv4ops)


def warmup_options(vllm_config) -> dict:
    """``dsv4ops.warmup`` keywords for the served model and vLLM's limits."""
    model = vllm_config.model_config.hf_config
    tp = vllm_config.parallel_config.tensor_parallel_size
    spec = vllm_config.speculative_config
    return dict(model="v4-pro" if getattr(model, "index_topk", 512) > 512 else "v4-flash", tp=tp,
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


def _add_splitting_ops() -> None:
    """dsv4ops' torch ops split vLLM's compiled graphs like its own attention ops."""
    seam = seams.BY_NAME["splitting_ops"]
    owner = importlib.import_module(seam.module)
    for part in seam.qualname.split(".")[:-1]:
        owner = getattr(owner, part)
    current = list(seams.resolve(seam.name))
    names = [f"dsv4ops::{op}" for op in ROUTED_OPS if hasattr(torch.ops.dsv4ops, op)]
    setattr(owner, seam.qualname.rsplit(".", 1)[1], current + [n for n in names if n not in current])
