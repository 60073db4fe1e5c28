"""Which vLLM attention step runs on dsv4ops, the per-op call counters, and the no-silent-fallback
rule. Imports no vLLM.

A step is one piece of vLLM's DeepSeek-V4 attention layer; it runs through dsv4ops unless one of
its ops is named in ``DSV4OPS_VLLM_NATIVE`` (vLLM's own kernels then run the whole step).
"""
from __future__ import annotations

import collections
import logging
import threading
from typing import Callable, Hashable

import dsv4ops

from ... import settings
from ...errors import ConfigError

log = logging.getLogger("vllm.dsv4ops")     # under vLLM's logger, so its handlers print it

# vLLM step -> the dsv4ops ops that serve it
STEPS = {
    "insert": ("qnorm_rope_kv_insert",),
    "attention": ("sparse_mla_decode", "sparse_mla_prefill"),
    "indexer": ("paged_mqa_topk", "mqa_topk"),
    "compressor": ("compress_kv_insert",),
    "o_proj": ("inv_rope_fp8_quant", "fp8_einsum"),
}
ROUTED_OPS = tuple(op for ops in STEPS.values() for op in ops)

_counts: collections.Counter = collections.Counter()
_lock = threading.Lock()
_checked: set[tuple] = set()          # (op, config) pairs already explained at load
_logged: set[str] = set()             # steps whose choice was logged


def native_ops() -> frozenset[str]:
    """``DSV4OPS_VLLM_NATIVE`` as a set of op names (ConfigError for a name that is not a routed op)."""
    names = frozenset(settings.current().vllm_native)
    unknown = sorted(names - set(ROUTED_OPS))
    if unknown:
        raise ConfigError(f"DSV4OPS_VLLM_NATIVE names {unknown}, which the vLLM plugin does not route; "
                          f"expected a comma-separated subset of {', '.join(ROUTED_OPS)}")
    return names


def routed(step: str) -> bool:
    """Whether ``step`` runs through dsv4ops (none of its ops opted into vLLM's kernels)."""
    return not native_ops().intersection(STEPS[step])


def call(op: str, *args, **kwargs):
    """``dsv4ops.<op>(*args, **kwargs)``, counted in ``routed_calls()``."""
    with _lock:
        _counts[op] += 1
    return dsv4ops.dispatch(op, *args, **kwargs)


def routed_calls() -> dict[str, int]:
    """dsv4ops op name -> calls the plugin made in this process."""
    with _lock:
        return dict(_counts)


def reset_routed_calls() -> None:
    with _lock:
        _counts.clear()


def require(step: str, config: Hashable, calls: Callable[[], list[tuple[str, tuple, dict]]]) -> None:
    """At model load: fail unless dsv4ops serves ``step`` for this layer configuration.

    ``calls()`` gives the step's representative calls ``(op, args, kwargs)`` built from the layer's
    configuration (``config``: a hashable summary, explained once per process). A step
    opted into vLLM's kernels is logged and not checked. Raises ConfigError naming the op, the
    arguments and dsv4ops' reason when no implementation accepts."""
    if not routed(step):
        _log_choice(step, "vLLM's own kernels (DSV4OPS_VLLM_NATIVE)")
        return
    if (step, config) in _checked:
        return
    chosen = []
    for op, args, kwargs in calls():
        decision = dsv4ops.explain(op, *args, **kwargs)
        if decision.selected is None:
            raise ConfigError(
                f"dsv4ops cannot serve vLLM's {step} step for this layer: {op}({_describe(args, kwargs)}) has "
                f"no implementation ({decision.error}).\n{decision}\nSet DSV4OPS_VLLM_NATIVE={op} to run this step "
                f"on vLLM's own kernels, or DSV4OPS_VLLM=0 to turn the plugin off.")
        chosen.append(f"{op} -> {decision.backend}")
    _checked.add((step, config))
    _log_choice(step, "dsv4ops (" + ", ".join(chosen) + ")")


def _log_choice(step: str, choice: str) -> None:
    if step not in _logged:
        _logged.add(step)
        log.info("dsv4ops vLLM plugin: %s step runs on %s", step, choice)


def _describe(args, kwargs) -> str:
    def one(v):
        if hasattr(v, "shape") and hasattr(v, "dtype"):
            return f"{str(v.dtype).replace('torch.', '')}{list(v.shape)}"
        return repr(v) if not isinstance(v, str) else repr(v)
    return ", ".join([one(v) for v in args] + [f"{k}={one(v)}" for k, v in kwargs.items()])
