"""Op 1 (spec §1): Q RMSNorm + RoPE, KV RoPE + quantize + paged insert at ``slot_mapping``."""
from __future__ import annotations

import torch

from .. import formats
from ..selection import OpCall, call_op, signature_of
from ._validate import Checker

NAME = "qnorm_rope_kv_insert"
MAX_HEADS = 128


def validate(q, kv, positions, cos_sin_cache, kv_cache, slot_mapping, *, layout, block_size,
             eps=1e-6, kv_scale=1.0, q_scale=1.0, out=None) -> OpCall:
    c = Checker(NAME)
    c.tensor("q", q, dtype=torch.bfloat16, shape=("T", "H", formats.HEAD_DIM), anchor=True, contiguous=True)
    T, H = q.shape[0], q.shape[1]
    if not 1 <= H <= MAX_HEADS:
        c.fail("q", f"must have 1 to {MAX_HEADS} heads, got H={H}")
    c.tensor("kv", kv, dtype=torch.bfloat16, shape=(T, formats.HEAD_DIM), last_dim_contiguous=True)
    c.tensor("positions", positions, dtype=torch.int64, shape=(T,))
    c.tensor("cos_sin_cache", cos_sin_cache, dtype=torch.float32, shape=("max_pos", formats.ROPE_DIM),
             contiguous=True)
    c.choice("layout", layout, formats.LAYOUTS)
    c.int_arg("block_size", block_size, minimum=1)
    check_kv_cache(c, "kv_cache", kv_cache, layout, block_size)
    c.tensor("slot_mapping", slot_mapping, dtype=torch.int64, shape=("T'",))
    if slot_mapping.shape[0] > T:
        c.fail("slot_mapping", f"must have at most T={T} entries, got {slot_mapping.shape[0]}")
    c.float_arg("eps", eps, positive=True)
    c.float_arg("kv_scale", kv_scale, positive=True, tensor_ok=True)
    c.float_arg("q_scale", q_scale, positive=True, tensor_ok=True)
    out_dtype = torch.float8_e4m3fn if layout == "fp8_per_tensor" else torch.bfloat16
    c.out_buffer(out, dtype=out_dtype, shape=(T, H, formats.HEAD_DIM))
    c.in_range("positions", positions, 0, cos_sin_cache.shape[0], what="positions (rows of cos_sin_cache)")
    c.in_range("slot_mapping", slot_mapping, None, kv_cache.shape[0] * block_size,
               what="slots (negative = skip)")
    kwargs = dict(q=q, kv=kv, positions=positions, cos_sin_cache=cos_sin_cache, kv_cache=kv_cache,
                  slot_mapping=slot_mapping, layout=layout, block_size=block_size, eps=eps,
                  kv_scale=kv_scale, q_scale=q_scale, out=out)
    return OpCall(NAME, kwargs, q.device, signature_of(kwargs))


def check_kv_cache(c: Checker, name: str, cache, layout: str, block_size: int) -> None:
    """``cache`` must be what ``formats.allocate_kv_cache(n, block_size, layout)`` returns."""
    if not isinstance(cache, torch.Tensor) or cache.dim() < 1:
        c.fail(name, f"must be a {layout} KV cache tensor, got {type(cache).__name__}")
    shape, dtype = formats.kv_cache_spec(cache.shape[0], block_size, layout)
    c.tensor(name, cache, dtype=dtype, shape=("num_blocks",) + shape[1:], contiguous=True)


def qnorm_rope_kv_insert(q, kv, positions, cos_sin_cache, kv_cache, slot_mapping, *, layout, block_size,
                         eps=1e-6, kv_scale=1.0, q_scale=1.0, out=None, backend=None):
    """Normalize + rope Q, rope + quantize KV into ``kv_cache`` at ``slot_mapping`` (-1 = skip).

    q bf16 [T, H, 512], kv bf16 [T, 512], positions int64 [T], cos_sin_cache fp32 [max_pos, 64],
    slot_mapping int64 [T'] (T' <= T). Returns bf16 [T, H, 512] (``q`` itself unless ``out``) for
    "fp8_ds_mla"/"bf16", float8_e4m3fn [T, H, 512] for "fp8_per_tensor" (``q`` unmodified).
    """
    return call_op(validate, dict(q=q, kv=kv, positions=positions, cos_sin_cache=cos_sin_cache, kv_cache=kv_cache,
                                  slot_mapping=slot_mapping, layout=layout, block_size=block_size, eps=eps,
                                  kv_scale=kv_scale, q_scale=q_scale, out=out), backend)
