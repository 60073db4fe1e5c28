"""dsv4ops: backend-agnostic DeepSeek-V4 attention ops.

    out, lse = dsv4ops.sparse_mla_decode(q, kv_cache, indices, lens, layout="fp8_ds_mla", ...)
    out, lse = dsv4ops.dispatch("sparse_mla_decode", q, kv_cache, indices, lens, ...)
    print(dsv4ops.explain("sparse_mla_decode", q, kv_cache, indices, lens, ...))

Importing this package imports no vendor library and no Triton; backends load on first use.
"""
from . import formats
from .formats import Layout
from .selection import Decision, decide
from .errors import ConfigError, Dsv4opsError, InputError, UnsupportedError, VerificationError
from .ops import inv_rope_fp8_quant
from .ops import compress_kv_insert
from .ops import OP_NAMES, OPS, fp8_einsum, indexer_topk, paged_mqa_logits, qnorm_rope_kv_insert, sparse_mla_decode
from .ops import sparse_mla_prefill
from .ops import mqa_logits
from .platform import Platform, platform, simulate_platform
from .prepared import PreparedOp, prepare
from .registry import Backend, BackendInfo
from . import backends, reference   # backends() lists them; backends.<vendor> are packages

__version__ = "0.1.0"


def _op(op_name: str):
    try:
        return OPS[op_name]
    except KeyError:
        raise InputError(f"unknown op {op_name!r}; ops are {', '.join(OP_NAMES)}") from None


def dispatch(op_name: str, *args, **kwargs):
    """Call op ``op_name`` by name: ``dispatch("indexer_topk", logits, 512, seq_lens=lens)``."""
    return _op(op_name).function(*args, **kwargs)


def explain(op_name: str, *args, backend: str | None = None, **kwargs) -> Decision:
    """Which implementation would run for these arguments, and why each other one would not."""
    return decide(_op(op_name).validate_call(*args, **kwargs), backend, evaluate_all=True)


__all__ = [
    "inv_rope_fp8_quant",
    "compress_kv_insert",
    "qnorm_rope_kv_insert", "sparse_mla_decode", "paged_mqa_logits", "fp8_einsum", "indexer_topk",
    "sparse_mla_prefill", "mqa_logits",
    "dispatch", "explain", "prepare", "PreparedOp", "backends", "platform", "simulate_platform", "formats", "reference",
    "Decision", "Platform", "Layout", "Backend", "BackendInfo", "OP_NAMES",
    "Dsv4opsError", "InputError", "UnsupportedError", "ConfigError", "VerificationError",
]
