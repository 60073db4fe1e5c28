"""dsv4ops sparse_mla_decode -> FlashInfer's DeepSeek-V4 sparse MLA decode.

SM100/SM103/SM107 (TRTLLM-gen cubins, ``trtllm_batch_decode_sparse_mla_dsv4``, flashinfer-python
0.7.2.post1): bf16 or per-tensor FP8 512-wide row caches. The kernel takes one combined index table
whose first 128 columns index the SWA cache and the rest the compressed cache, int32 with a width
that is a multiple of 4 (padded here with -1 columns); the SWA columns attended are the first
``seq_lens[b]`` (each token is its own request here, so ``seq_lens = topk_lens``, raised to 1 with a
-1 in column 0 for tokens without SWA entries, since FlashInfer validates ``seq_lens >= q_len``) and
the total lengths include the 128 SWA columns. Heads are padded to {8, 16, 32, 64, 128}. The kernel
returns no log-sum-exp, so this path serves ``need_lse=False`` calls only.

SM120/SM121 (``sparse_mla_sm120_decode_dsv4``, needs 0.7.x for ``lse_scale``): the 584-byte MODEL1
cache as the 2-D view of each page's used bytes ``cache[:, :bs*584]`` (0.7.2 requires a 2-D width
divisible by 584; the padded page of ``round_up(bs*584, 576)`` bytes is not, e.g. for bs 64), BF16 query,
base-2 LSE (scaled to natural log with ``lse_scale``). The kernel applies the sink to the output,
but its LSE then includes the sink, which cannot be undone stably (a sink of +inf loses it
entirely). So when the caller wants the LSE and passes a sink, the kernel runs twice: once without
the sink for the LSE, once with it for the output (one bf16 rounding, as in FlashMLA).
"""
from __future__ import annotations

import math

import torch

from dsv4ops.backend_support import decode_output, dense, pad_heads
from dsv4ops.formats import DS_MLA_TOKEN_BYTES
from dsv4ops.quant import as_float

SWA_WIDTH = 128
TABLE_MULTIPLE = 4
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


def decode_trtllm(a):
    from flashinfer.mla import trtllm_batch_decode_sparse_mla_dsv4

    T, H, _ = a.q.shape
    result = decode_output(a.q, a.out)
    if T == 0:
        return result, None
    Hp = trtllm_heads(H)
    query, sinks = pad_heads(a.q, a.attn_sink, Hp)
    swa = dense(a.indices)
    if a.topk_lens is not None:
        # seq_lens >= q_len (1) is validated by FlashInfer: a token with no SWA entry gets seq_lens 1
        # and a -1 in its first SWA column instead (-1 columns are never attended).
        swa = swa.clone()
        swa[:, 0].masked_fill_(a.topk_lens == 0, -1)
        swa_lens = a.topk_lens.clamp_min(1).to(torch.int32)
    else:
        swa_lens = torch.full((T,), SWA_WIDTH, dtype=torch.int32, device=a.q.device)
    if a.extra_kv_cache is not None:
        parts = [swa, a.extra_indices]
        extra_lens = (a.extra_topk_lens if a.extra_topk_lens is not None
                      else torch.full((T,), a.extra_indices.shape[1], dtype=torch.int32, device=a.q.device))
        compressed = a.extra_kv_cache
    else:
        parts, extra_lens, compressed = [swa], torch.zeros_like(swa_lens), a.kv_cache
    width = sum(p.shape[1] for p in parts)
    if width % TABLE_MULTIPLE:                          # 0.7.x: sparse_indices width % 4 == 0 (-1 padded)
        parts.append(torch.full((T, -width % TABLE_MULTIPLE), -1, dtype=torch.int32, device=a.q.device))
    table = torch.cat(parts, dim=1) if len(parts) > 1 else parts[0]
    kv_s, q_s = as_float(a.kv_scale), as_float(a.q_scale)
    per_tensor = a.layout.has_tensor_scale
    o = trtllm_batch_decode_sparse_mla_dsv4(
        query.unsqueeze(1), a.kv_cache.unsqueeze(1), _workspace(a.q.device),
        sparse_indices=table, compressed_kv_cache=compressed.unsqueeze(1),
        sparse_topk_lens=(extra_lens + SWA_WIDTH).to(torch.int32), seq_lens=swa_lens,
        bmm1_scale=a.softmax_scale * (q_s * kv_s if per_tensor else 1.0), bmm2_scale=kv_s if per_tensor else 1.0,
        sinks=sinks, kv_layout="HND", backend="trtllm-gen",
    )
    result.copy_(o.view(T, Hp, 512)[:, :H])
    return result, None


def decode_sm120(a):
    from flashinfer.mla._sparse_mla_sm120 import sparse_mla_sm120_decode_dsv4

    T, H, _ = a.q.shape
    result = decode_output(a.q, a.out)
    lse = torch.empty(T, H, dtype=torch.float32, device=a.q.device)
    if T == 0:
        return result, lse if a.need_lse else None
    scratch_heads = 8 if H == 8 else -(-H // 16) * 16
    extra_topk = a.extra_indices.shape[1] if a.extra_indices is not None else 0
    splits = -(-a.indices.shape[1] // 64) + -(-extra_topk // 64)
    mid_out = torch.empty(T, scratch_heads, splits, 512, dtype=torch.bfloat16, device=a.q.device)
    mid_lse = torch.empty(T, scratch_heads, splits, dtype=torch.float32, device=a.q.device)

    # 0.7.2's parse_paged_kv_layout wants a 2-D width that is a multiple of 584: pass the pages'
    # used bytes (a strided view; stride(0) = page bytes, a multiple of 16), not the padded page.
    cache = a.kv_cache[:, : a.block_size * DS_MLA_TOKEN_BYTES]
    extra_cache = (a.extra_kv_cache[:, : a.extra_block_size * DS_MLA_TOKEN_BYTES]
                   if a.extra_kv_cache is not None else None)

    def run(output, sink):
        sparse_mla_sm120_decode_dsv4(
            a.q, cache, dense(a.indices), mid_out, mid_lse, output, lse, a.softmax_scale,
            topk_length=dense(a.topk_lens), attn_sink=dense(sink), extra_kv_cache=extra_cache,
            extra_indices=dense(a.extra_indices), extra_topk_length=dense(a.extra_topk_lens), lse_scale=math.log(2.0))

    if a.need_lse and a.attn_sink is not None:
        run(torch.empty_like(result), None)
        sink_free_lse = lse.clone()
        run(result, a.attn_sink)
        lse.copy_(sink_free_lse)
    else:
        run(result, a.attn_sink)
    if not a.need_lse:
        return result, None
    return result, lse.masked_fill_(lse == float("-inf"), float("inf"))    # lonely rows: +inf

