"""dsv4ops ops -> ROCm AITER (released entry points; floors in backends/aiter/__init__.py).

sparse_mla_decode -> ``aiter.ops.triton.attention.pa_decode_sparse.pa_decode_sparse`` (AITER
v0.1.20 signature: ``(q, unified_kv, kv_indices, kv_indptr, attn_sink, softmax_scale,
kv_scales=None, block_h=None, kv_splits=None, has_invalid=True, skip_reduce=False, USE_EXP2=None,
*, extra_cache=None, extra_indices=None, extra_indptr=None) -> out``).
  - The index lists become AITER's CSR stream without a host sync: every token keeps its full row
    (``kv_indptr = arange(T + 1) * topk``) and entries past the length turn into -1 sentinels,
    which ``has_invalid=True`` skips. Indices are global slot ids (``page * block_size + row``).
  - gfx950 (Gluon DSV4 driver): fp8_ds_mla as the 3-D ``[nb, bs, 584]`` view of the page bytes
    (``stride(0)`` = page bytes, which is how the kernel addresses the page: data rows at
    ``pos * 576``, UE8M0 scale rows at ``bs * 576 + pos * 8``), bf16 as the ``[nb, bs, 512]`` cache
    itself; the extra cache goes through ``extra_cache/extra_indices/extra_indptr``.
    fp8_per_tensor: the 2-D OCP pool ``[nb * bs, 512]`` with a materialised fp32 ``[nb * bs, 8]``
    per-64 scale tensor holding ``kv_scale`` (32 bytes per token per call), and the fp8 query
    dequantized to bf16 (``q * q_scale``; the kernel takes bf16/fp16 queries only).
  - gfx942 and others (Triton kernel): the bf16 cache as the flat page-size-1 pool ``[nb * bs, 512]``.
    That kernel loads ``attn_sink`` unconditionally and seeds its running max with it, so a sink
    tensor is always passed (-1e30 when the call has none) and +-inf sinks are clamped to +-1e30
    (an infinite seed gives exp2(inf - inf) = NaN; +-1e30 gives the same output as +-inf).
  - Rows that select no key: the gfx950 kernel without a sink returns 0/0 = NaN, so those rows are
    zeroed here (the contract says 0), on every arch.
  - pa_decode_sparse returns a new tensor (no ``out=``) and no log-sum-exp: the result is copied
    into the output, and only ``need_lse=False`` calls are routed here.

indexer_topk -> ``aiter.ops.topk.top_k_per_row_decode`` (1-D lengths: the kernel's causal MTP rule
``seqLens[b] - next_n + j + 1`` is ours) or ``top_k_per_row_prefill`` (2-D lengths with zero starts,
and row ranges). The kernels return **absolute** columns (``i + rowStart``; csrc/kernels/
topk_per_row_kernels.cu) with -1 past the row's count, so the row start is subtracted here to give
the row-local indices of docs/ops.md §5. ``stride1`` is ignored by the kernel (unit column stride
assumed), so a non-unit-stride logits view is copied first.
"""
from __future__ import annotations

import torch

from dsv4ops import formats
from dsv4ops.backend_support import decode_output, dense, topk_output
from dsv4ops.platform import Platform
from dsv4ops.rows import row_bounds

SINK_CLAMP = 1e30


def _block_view(cache: torch.Tensor, layout: str, block_size: int) -> torch.Tensor:
    """The cache as AITER's 3-D block cache over the same memory (stride(0) = page bytes)."""
    if formats.Layout.of(layout).is_ds_mla:
        return cache[:, : block_size * formats.DS_MLA_TOKEN_BYTES].view(cache.shape[0], block_size,
                                                                         formats.DS_MLA_TOKEN_BYTES)
    return cache


def _csr(indices: torch.Tensor, lens: torch.Tensor | None):
    """[T, topk] + lengths -> (indptr [T + 1], flat indices with -1 past each length, valid count [T])."""
    T, topk = indices.shape
    if lens is not None:
        past = torch.arange(topk, device=indices.device)[None, :] >= lens[:, None]
        indices = torch.where(past, -1, indices)
    indptr = torch.arange(T + 1, dtype=torch.int32, device=indices.device) * topk
    return indptr, indices.reshape(-1).to(torch.int32).contiguous(), (indices != -1).sum(1)


def _pool_scales(kv_scale, pages: int, device) -> torch.Tensor:
    """``kv_scale`` as AITER's per-token per-64-dim fp32 scale tensor ``[pages, 512 / 64]``."""
    s = torch.as_tensor(kv_scale, dtype=torch.float32, device=device).reshape(1, 1)
    return s.expand(pages, formats.HEAD_DIM // 64).contiguous()


def sparse_mla_decode(plat: Platform, a):
    from aiter.ops.triton.attention.pa_decode_sparse import pa_decode_sparse

    T, H, _ = a.q.shape
    result = decode_output(a.q, a.out)
    if T == 0:
        return result, None
    gfx950 = plat.arch == "gfx950"
    indptr, flat, count = _csr(a.indices, a.topk_lens)
    sink = None
    if a.attn_sink is not None:
        sink = a.attn_sink.to(torch.float32).clamp(-SINK_CLAMP, SINK_CLAMP).contiguous()
    elif not gfx950:
        sink = torch.full((H,), -SINK_CLAMP, dtype=torch.float32, device=a.q.device)
    if a.layout.has_tensor_scale:                      # gfx950 2-D OCP pool (capability check)
        pool = a.kv_cache.reshape(-1, formats.HEAD_DIM)
        q_bf16 = (a.q.float() * torch.as_tensor(a.q_scale, dtype=torch.float32, device=a.q.device)).to(torch.bfloat16)
        o = pa_decode_sparse(q_bf16, pool, flat, indptr, sink, a.softmax_scale,
                             _pool_scales(a.kv_scale, pool.shape[0], a.q.device), has_invalid=True)
    elif gfx950:
        extra = {}
        if a.extra_kv_cache is not None:
            x_indptr, x_flat, x_count = _csr(a.extra_indices, a.extra_topk_lens)
            count = count + x_count
            extra = dict(extra_cache=_block_view(a.extra_kv_cache, a.layout, a.extra_block_size),
                         extra_indices=x_flat, extra_indptr=x_indptr)
        o = pa_decode_sparse(a.q, _block_view(a.kv_cache, a.layout, a.block_size), flat, indptr, sink, a.softmax_scale,
                             has_invalid=True, **extra)
    else:                                               # gfx942: bf16 single segment
        o = pa_decode_sparse(a.q, a.kv_cache.reshape(-1, formats.HEAD_DIM), flat, indptr, sink, a.softmax_scale,
                             has_invalid=True)
    lonely = (count == 0)[:, None, None]
    result.copy_(torch.where(lonely, 0.0, o.view(T, H, formats.HEAD_DIM)))
    return result, None


def indexer_topk(plat: Platform, a):
    from aiter.ops.topk import top_k_per_row_decode, top_k_per_row_prefill

    logits = a.logits
    R = logits.shape[0]
    result = topk_output(a)
    if R == 0:
        return result
    if logits.stride(1) != 1:
        logits = logits.contiguous()
    starts, ends = row_bounds(a.row_starts, a.row_ends, a.seq_lens, a.next_n)
    if a.seq_lens is not None and a.seq_lens.dim() == 1:
        top_k_per_row_decode(logits, a.next_n, dense(a.seq_lens), result, R, logits.stride(0), logits.stride(1),
                             k=a.k)
    else:
        top_k_per_row_prefill(logits, starts.to(torch.int32), ends.to(torch.int32), result, None, R,
                              logits.stride(0), logits.stride(1), k=a.k)
    if a.row_starts is not None:                          # absolute columns -> row-local
        result.copy_(torch.where(result >= 0, result - starts.to(torch.int32)[:, None], -1))
    filled = (ends - starts).clamp(0, a.k)
    past = torch.arange(a.k, device=logits.device)[None, :] >= filled[:, None]
    return result.masked_fill_(past, -1)
