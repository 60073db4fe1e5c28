"""dsv4ops sparse_mla_decode -> FlashInfer's DeepSeek-V4 sparse MLA decode.

SM100/SM103 (TRTLLM-gen cubins, ``trtllm_batch_decode_sparse_mla_dsv4``): bf16 or per-tensor FP8
512-wide row caches. The kernel takes one combined index table whose first 128 columns index the
SWA cache and the rest the compressed cache; the SWA columns attended are the first
``seq_lens[b]`` (each token is its own request here, so ``seq_lens = topk_lens``) and the total
lengths include the 128 SWA columns. Heads are padded to {8, 16, 32, 64, 128}. The kernel
returns no log-sum-exp, so this path serves ``need_lse=False`` calls only.

SM120/SM121 (``sparse_mla_sm120_decode_dsv4``): the 584-byte MODEL1 cache as is, BF16 query,
base-2 LSE (scaled to natural log with ``lse_scale``). The kernel applies the sink to the output,
but its LSE then includes the sink, which cannot be undone stably (a sink of +inf loses it
entirely). So when the caller wants the LSE and passes a sink, the kernel runs twice: once without
the sink for the LSE, once with it for the output (one bf16 rounding, as in FlashMLA).
"""
from __future__ import annotations

import math

import torch

from dsv4ops.backend_support import decode_output, pad_heads
from dsv4ops.quant import as_float

SWA_WIDTH = 128
TRTLLM_HEADS = (8, 16, 32, 64, 128)
WORKSPACE_BYTES = 128 * 1024 * 1024
_workspaces: dict[torch.device, torch.Tensor] = {}


def trtllm_heads(H: int) -> int:
    return next(h for h in TRTLLM_HEADS if h >= H)


def _workspace(device: torch.device) -> torch.Tensor:
    """One zero-initialised workspace per device, owned by the backend (stable for CUDA graphs)."""
    if device not in _workspaces:
        _workspaces[device] = torch.zeros(WORKSPACE_BYTES, dtype=torch.uint8, device=device)
    return _workspaces[device]


def decode_trtllm(q, kv_cache, indices, topk_lens=None, *, layout, block_size, softmax_scale, attn_sink=None,
                  extra_kv_cache=None, extra_indices=None, extra_topk_lens=None, extra_block_size=None,
                  kv_scale=1.0, q_scale=1.0, out=None, need_lse=True):
    from flashinfer.mla import trtllm_batch_decode_sparse_mla_dsv4

    T, H, _ = q.shape
    result = decode_output(q, out)
    if T == 0:
        return result, None
    Hp = trtllm_heads(H)
    query, sinks = pad_heads(q, attn_sink, Hp)
    swa_lens = topk_lens if topk_lens is not None else torch.full((T,), SWA_WIDTH, dtype=torch.int32, device=q.device)
    if extra_kv_cache is not None:
        table = torch.cat([indices, extra_indices], dim=1)
        extra_lens = (extra_topk_lens if extra_topk_lens is not None
                      else torch.full((T,), extra_indices.shape[1], dtype=torch.int32, device=q.device))
        compressed = extra_kv_cache
    else:
        table, extra_lens, compressed = indices, torch.zeros_like(swa_lens), kv_cache
    kv_s, q_s = as_float(kv_scale), as_float(q_scale)
    per_tensor = layout == "fp8_per_tensor"
    o = trtllm_batch_decode_sparse_mla_dsv4(
        query.unsqueeze(1), kv_cache.unsqueeze(1), _workspace(q.device),
        sparse_indices=table, compressed_kv_cache=compressed.unsqueeze(1),
        sparse_topk_lens=(extra_lens + SWA_WIDTH).to(torch.int32), seq_lens=swa_lens,
        bmm1_scale=softmax_scale * (q_s * kv_s if per_tensor else 1.0), bmm2_scale=kv_s if per_tensor else 1.0,
        sinks=sinks, kv_layout="HND", backend="trtllm-gen",
    )
    result.copy_(o.view(T, Hp, 512)[:, :H])
    return result, None


def decode_sm120(q, kv_cache, indices, topk_lens=None, *, layout, block_size, softmax_scale, attn_sink=None,
                 extra_kv_cache=None, extra_indices=None, extra_topk_lens=None, extra_block_size=None,
                 kv_scale=1.0, q_scale=1.0, out=None, need_lse=True):
    from flashinfer.mla._sparse_mla_sm120 import sparse_mla_sm120_decode_dsv4

    T, H, _ = q.shape
    result = decode_output(q, out)
    lse = torch.empty(T, H, dtype=torch.float32, device=q.device)
    if T == 0:
        return result, lse if need_lse else None
    scratch_heads = 8 if H == 8 else -(-H // 16) * 16
    extra_topk = extra_indices.shape[1] if extra_indices is not None else 0
    splits = -(-indices.shape[1] // 64) + -(-extra_topk // 64)
    mid_out = torch.empty(T, scratch_heads, splits, 512, dtype=torch.bfloat16, device=q.device)
    mid_lse = torch.empty(T, scratch_heads, splits, dtype=torch.float32, device=q.device)

    def run(output, sink):
        sparse_mla_sm120_decode_dsv4(
            q, kv_cache, indices, mid_out, mid_lse, output, lse, softmax_scale, topk_length=topk_lens,
            attn_sink=sink, extra_kv_cache=extra_kv_cache, extra_indices=extra_indices,
            extra_topk_length=extra_topk_lens, lse_scale=math.log(2.0))

    if need_lse and attn_sink is not None:
        run(torch.empty_like(result), None)
        sink_free_lse = lse.clone()
        run(result, attn_sink)
        lse.copy_(sink_free_lse)
    else:
        run(result, attn_sink)
    if not need_lse:
        return result, None
    return result, lse.masked_fill_(lse == float("-inf"), float("inf"))    # lonely rows: +inf

