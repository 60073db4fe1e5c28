"""docs/ops.md §10: sparse MQA prefill, the many-token counterpart of sparse_mla_decode.

Same arguments, checks and semantics as sparse_mla_decode (one index row per query token over the
SWA cache plus an optional compressed cache, attention sink, lonely-row rule); a separate op because
engines call a different kernel for prefill (compute-bound: thousands of tokens, 64 or 128 heads,
1K+ selected rows each) and backends differ per op (FlashMLA ``flash_mla_sparse_fwd`` over a
gathered bf16 workspace, AITER ``pa_prefill_sparse``).
"""
from __future__ import annotations

from ..opspec import OpSpec, define
from .sparse_mla_decode import SPEC as DECODE

SPEC = OpSpec(
    name="sparse_mla_prefill",
    doc="""Sparse MQA prefill. q [T, H, 512] (bf16; fp8 for "fp8_per_tensor"), H <= 128; indices int32
    [T, topk] into kv_cache (block * block_size + offset, -1 invalid); topk_lens int32 [T]; the
    optional extra (compressed) cache with extra_indices [T, extra_topk]; attn_sink fp32 [H].
    Returns out bf16 [T, H, 512] and lse fp32 [T, H] (natural log, sink excluded, +inf if lonely);
    with ``need_lse=False`` the second element is None (AITER's pa_prefill_sparse has no lse).
    The caches are read in place: a backend that needs a gathered bf16 workspace builds it itself.""",
    args=DECODE.args,
    outputs=DECODE.outputs,
    check=DECODE.check,
    fake=DECODE.fake,
)
OP = define(SPEC)
sparse_mla_prefill = OP.function
