"""dsv4ops ops -> ROCm AITER.

sparse_mla_decode -> ``aiter.ops.triton.attention.sparse_mla.sparse_mla_fwd`` (Triton/Gluon). The
index lists become AITER's CSR stream without a host sync: every token keeps its full row
(``kv_indptr = arange(T + 1) * topk``) and entries past the length turn into -1 sentinels
(``has_invalid=True``). Caches are passed as the ``[num_blocks, block_size, R]`` views AITER
classifies by record width: 584-byte MODEL1 records (``fp8_dsv4_mla``), 512-wide bf16 rows, or
per-tensor fp8 rows with a ``[1]`` f32 ``kv_scale`` (``fp8_scalar``). AITER folds the sink into
its log-sum-exp and its DSV4 paths return none, so only ``need_lse=False`` calls are served.

indexer_topk -> ``aiter.ops.topk.top_k_per_row_decode`` (1-D lengths, causal MTP rule) or
``top_k_per_row_prefill`` with zero row starts (2-D lengths). Row ranges with nonzero starts are
not routed here: whether AITER returns ``column - start`` or ``column`` is unconfirmed (spec
open question 3). Slots past a row's count are set to -1 here rather than trusting the kernel.
"""
from __future__ import annotations

import torch

from dsv4ops import formats
from dsv4ops.backend_support import decode_output
from dsv4ops.ops._rows import decode_row_ends


def _block_view(cache: torch.Tensor, layout: str, block_size: int) -> torch.Tensor:
    """The cache as AITER's 3-D block pool over the same memory."""
    if formats.is_ds_mla(layout):
        return cache[:, : block_size * formats.DS_MLA_TOKEN_BYTES].view(cache.shape[0], block_size,
                                                                         formats.DS_MLA_TOKEN_BYTES)
    return cache


def _csr(indices: torch.Tensor, lens: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
    """[T, topk] + lengths -> (indptr [T + 1], flat indices with -1 past each length)."""
    T, topk = indices.shape
    if lens is not None:
        past = torch.arange(topk, device=indices.device)[None, :] >= lens[:, None]
        indices = torch.where(past, -1, indices)
    indptr = torch.arange(T + 1, dtype=torch.int32, device=indices.device) * topk
    return indptr, indices.reshape(-1).to(torch.int32)


def _scale_tensor(x, device) -> torch.Tensor:
    if isinstance(x, torch.Tensor):
        return x.reshape(1).to(torch.float32)
    return torch.full((1,), float(x), dtype=torch.float32, device=device)


def sparse_mla_decode(q, kv_cache, indices, topk_lens=None, *, layout, block_size, softmax_scale, attn_sink=None,
                      extra_kv_cache=None, extra_indices=None, extra_topk_lens=None, extra_block_size=None,
                      kv_scale=1.0, q_scale=1.0, out=None, need_lse=True):
    from aiter.ops.triton.attention.sparse_mla import sparse_mla_fwd

    T, H, _ = q.shape
    result = decode_output(q, out)
    if T == 0:
        return result, None
    per_tensor = layout == "fp8_per_tensor"
    indptr, flat = _csr(indices, topk_lens)
    extra = {}
    if extra_kv_cache is not None:
        x_indptr, x_flat = _csr(extra_indices, extra_topk_lens)
        extra = dict(extra_kv=_block_view(extra_kv_cache, layout, extra_block_size), extra_indptr=x_indptr,
                     extra_indices=x_flat)
    kv_scale_t = _scale_tensor(kv_scale, q.device) if per_tensor else None
    sparse_mla_fwd(
        q, _block_view(kv_cache, layout, block_size), indptr, flat, softmax_scale,
        kv_scale=kv_scale_t, kv_lora_rank=512, qk_rope_head_dim=0, has_invalid=True,
        q_scale=_scale_tensor(q_scale, q.device) if per_tensor else None, out=result, attn_sink=attn_sink,
        **extra)
    return result, None


def indexer_topk(logits, k, *, row_starts=None, row_ends=None, seq_lens=None, next_n=1, out=None):
    from aiter.ops.topk import top_k_per_row_decode, top_k_per_row_prefill

    R = logits.shape[0]
    result = torch.empty(R, k, dtype=torch.int32, device=logits.device) if out is None else out
    if R == 0:
        return result
    if seq_lens.dim() == 1:
        top_k_per_row_decode(logits, next_n, seq_lens, result, R, logits.stride(0), logits.stride(1), k=k)
    else:
        ends = seq_lens.reshape(-1).to(torch.int32)
        top_k_per_row_prefill(logits, torch.zeros_like(ends), ends, result, None, R, logits.stride(0),
                              logits.stride(1), k=k)
    filled = decode_row_ends(seq_lens, next_n).clamp(max=k)
    past = torch.arange(k, device=logits.device)[None, :] >= filled[:, None]
    return result.masked_fill_(past, -1)
