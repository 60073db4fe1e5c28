"""dsv4ops: backend-agnostic DeepSeek-V4 attention ops.

    out, lse = dsv4ops.sparse_mla_decode(q, kv_cache, indices, lens, layout="fp8_ds_mla", ...)
    out, lse = dsv4ops.dispatch("sparse_mla_decode", q, kv_cache, indices, lens, ...)
    print(dsv4ops.explain("sparse_mla_decode", q, kv_cache, indices, lens, ...))

Importing this package imports no vendor library and no Triton; backends load on first use.
"""
from . import backends, formats, reference  # backends() lists them; backends.<vendor> are their packages
from .errors import ConfigError, Dsv4opsError, InputError, UnsupportedError, VerificationError
from .formats import Layout
from .ops import OP_NAMES, OPS
from .platform import Platform, platform, simulate_platform
from .prepared import PreparedOp, prepare
from .registry import Backend, BackendInfo
from .selection import Decision, decide

# dsv4ops.<op>: each op's public function (its signature and docstring come from its spec)
globals().update({name: op.function for name, op in OPS.items()})

__version__ = "0.1.0"


def _op(op_name: str):
    try:
        return OPS[op_name]
    except KeyError:
        raise InputError(f"unknown op {op_name!r}; ops are {', '.join(OP_NAMES)}") from None


def dispatch(op_name: str, *args, **kwargs):
    """Call op ``op_name`` by name: ``dispatch("indexer_topk", logits, 512, seq_lens=lens)``."""
    return _op(op_name).function(*args, **kwargs)


def explain(op_name: str, *args, backend: str | None = None, capturable: bool | None = None, **kwargs) -> Decision:
    """Which implementation would run for these arguments, and why each other one would not
    (``capturable=True``: as under CUDA-graph capture; None: as now)."""
    return decide(_op(op_name).validate_call(*args, **kwargs), backend, evaluate_all=True, capturable=capturable)


def warmup(ops=None, **options):
    """Compile every kernel variant ``ops`` (default: all) can meet within an engine's limits, for
    every selected backend, before serving: ``dsv4ops.warmup(model="v4-flash", tp=1,
    limits=dict(max_tokens=8192, max_context=131072, next_n=2))``. Returns a summary (variants,
    time, cache folder; on a machine without a GPU an empty one whose ``reason`` says why, and a
    warning); the options are ``dsv4ops.warm_up.warmup``'s. Imports Triton (on call)."""
    from .warm_up import warmup as run

    return run(ops, **options)


__all__ = [
    *OP_NAMES,
    "dispatch", "explain", "prepare", "warmup", "PreparedOp", "backends", "platform", "simulate_platform", "formats", "reference",
    "Decision", "Platform", "Layout", "Backend", "BackendInfo", "OP_NAMES",
    "Dsv4opsError", "InputError", "UnsupportedError", "ConfigError", "VerificationError",
]
