"""Fakes of the FlashInfer entry points that backends/flashinfer calls, for flashinfer-python
0.7.2.post1 (the PyPI wheel, read directly: flashinfer/mla/_core.py, flashinfer/mla/_sparse_mla_sm120/
_api.py, flashinfer/topk.py, flashinfer/data/csrc/sparse_mla_sm120/attention_validation.h). The
parameter lists are the release's, copied as signatures only; the bodies model the documented
semantics in plain PyTorch and assert the argument checks that the release makes.
"""
import math
import sys
import types

from typing import Literal, Optional, Tuple, Union

import torch

import dsv4ops


def _attend(q, keys, valid, scale, sinks):
    """softmax(scale * q.k) over valid keys (duplicates count), sink in the denominator.
    q [T, H, 512] fp32, keys [T, K, 512] fp32, valid [T, K] -> (out [T, H, 512], lse [T, H] natural)."""
    s = torch.einsum("thd,tkd->thk", q, torch.where(valid[..., None], keys, 0.0)) * scale
    s = s.masked_fill(~valid[:, None, :], float("-inf"))
    lse = torch.logsumexp(s, -1)
    empty = lse == float("-inf")
    p = torch.exp(s - torch.where(empty, 0.0, lse)[..., None])
    out = torch.einsum("thk,tkd->thd", p, torch.where(valid[..., None], keys, 0.0))
    if sinks is not None:
        out = out * torch.sigmoid(lse - sinks[None, :])[..., None]
    return torch.where(empty[..., None], 0.0, out), lse


def trtllm_batch_decode_sparse_mla_dsv4(
    query: torch.Tensor,
    swa_kv_cache: torch.Tensor,
    workspace_buffer: torch.Tensor,
    sparse_indices: Optional[torch.Tensor] = None,
    compressed_kv_cache: Optional[torch.Tensor] = None,
    sparse_topk_lens: Optional[torch.Tensor] = None,
    seq_lens: Optional[torch.Tensor] = None,
    out: Optional[torch.Tensor] = None,
    bmm1_scale: Union[float, torch.Tensor] = 1.0,
    bmm2_scale: Union[float, torch.Tensor] = 1.0,
    sinks: Optional[torch.Tensor] = None,
    kv_layout: Literal["HND", "NHD"] = "HND",
    cum_seq_lens_q: Optional[torch.Tensor] = None,
    max_q_len: Optional[int] = None,
    enable_pdl: bool | None = None,
    swa_topk_lens: Optional[torch.Tensor] = None,
    extra_sparse_indices: Optional[torch.Tensor] = None,
    extra_sparse_topk_lens: Optional[torch.Tensor] = None,
    backend: Literal["auto", "trtllm-gen", "cute-dsl", "sparse", "cake"] = "auto",
    hca_swa_indices: Optional[torch.Tensor] = None,
    hca_compressed_block_tables: Optional[torch.Tensor] = None,
    hca_seq_lens: Optional[torch.Tensor] = None,
    hca_is_causal: bool = True,
    hca_use_persistent: bool = False,
    hca_sparse_indices_format: Optional[Literal["compressed-page-aligned"]] = None,
    remapped_sparse_indices_buffer: Optional[torch.Tensor] = None,
    sparse_indices_are_storage_offsets: Optional[bool] = None,
    dsv4_inv_rope_cos_sin_cache: Optional[torch.Tensor] = None,
    dsv4_output_scale: Optional[torch.Tensor] = None,
    sparse_topk_lens_offset: int = 0,
    multi_ctas_kv_counter_buffer: Optional[torch.Tensor] = None,
    *,
    kv_cache_format: Literal["fp8", "nvfp4", "fp8_dsv41", "fp8_dsv41_fp4_ca"] = "fp8",
) -> Union[torch.Tensor, Tuple[torch.Tensor, torch.Tensor]]:
    """'The first 128 columns of sparse_indices are SWA entries into swa_kv_cache; remaining columns are
    compressed entries into compressed_kv_cache. sparse_topk_lens gives the total active sparse length
    for each query token and must include the fixed 128 SWA entries. seq_lens provides the original KV
    sequence length for the SWA validity window' (only the first clamp(seq_lens, 0, 128) SWA columns);
    '-1 slots ... are never attended'. Query [B, Q, H, 512] BF16 or FP8, heads in {8,...,128}."""
    B, Q, H, D = query.shape
    assert D == 512 and H in (8, 16, 32, 64, 128) and Q == 1, (B, Q, H, D)
    assert query.dtype in (torch.bfloat16, torch.float8_e4m3fn) and kv_layout == "HND"
    assert swa_kv_cache.dim() == 4 and swa_kv_cache.shape[1] == 1 and swa_kv_cache.shape[-1] == 512
    assert sparse_indices.dtype == torch.int32 and sparse_indices.stride(-1) == 1 and sparse_indices.dim() == 2
    assert sparse_indices.shape[1] >= 128 and sparse_indices.shape[1] % 4 == 0, "width >= 128, multiple of 4"
    assert bool((seq_lens >= 1).all()), "seq_lens must be >= q_len (FLASHINFER_VALIDATE_INPUTS)"
    for pool in (swa_kv_cache, compressed_kv_cache):                   # strided pools need the flag (#3856)
        assert pool.stride(-2) == pool.size(-1) and pool.stride(0) == pool.size(-2) * pool.stride(-2) \
            or sparse_indices_are_storage_offsets is not None
    assert sparse_topk_lens.dtype == torch.int32 and seq_lens.dtype == torch.int32
    assert bool((sparse_topk_lens <= sparse_indices.shape[1]).all())
    assert workspace_buffer.dtype == torch.uint8 and isinstance(bmm1_scale, float)
    width = sparse_indices.shape[1]
    col = torch.arange(width)
    swa = col[None, :] < 128
    valid = (sparse_indices != -1) & torch.where(swa, col[None, :] < seq_lens.clamp(0, 128)[:, None],
                                                 col[None, :] < sparse_topk_lens[:, None])
    safe = torch.where(valid, sparse_indices, 0).long()
    swa_rows = swa_kv_cache.reshape(-1, 512).float()
    comp_rows = compressed_kv_cache.reshape(-1, 512).float()
    keys = torch.where(swa[..., None], swa_rows[safe.clamp(max=swa_rows.shape[0] - 1)],
                       comp_rows[safe.clamp(max=comp_rows.shape[0] - 1)])
    o, _ = _attend(query[:, 0].float(), keys, valid, bmm1_scale, sinks)
    return (o * bmm2_scale).to(torch.bfloat16).view(B, Q, H, D)


def sparse_mla_sm120_decode_dsv4(
    q: torch.Tensor,
    kv_cache: torch.Tensor,
    indices: torch.Tensor,
    mid_out: torch.Tensor,
    mid_lse: torch.Tensor,
    output: torch.Tensor,
    out_lse: torch.Tensor,
    sm_scale: float,
    *,
    topk_length: Optional[torch.Tensor] = None,
    attn_sink: Optional[torch.Tensor] = None,
    extra_kv_cache: Optional[torch.Tensor] = None,
    extra_indices: Optional[torch.Tensor] = None,
    extra_topk_length: Optional[torch.Tensor] = None,
    chunks_per_block: Optional[int] = None,
    model_type: Optional[int] = None,
    extra_fp4: bool = False,
    lse_scale: float = 1.0,
) -> torch.Tensor:
    """MODEL1 584-byte cache [num_blocks, page_bytes]; 'Final LSE uses base 2 by default ... lse_scale
    multiplies final base-2 LSE values'; sink: 'output *= sigmoid(lse - sink) and
    lse' = log(exp(lse) + exp(sink))'; empty rows: output 0, LSE -inf without a sink.
    Scratch: mid_out [T, scratch_heads, num_splits, 512] bf16 with scratch_heads 8 for H=8 else
    ceil(H/16)*16 and num_splits = ceil(topk/64) + ceil(extra_topk/64)."""
    T, H, _ = q.shape
    scratch_heads = 8 if H == 8 else math.ceil(H / 16) * 16
    splits = math.ceil(indices.shape[1] / 64) + (math.ceil(extra_indices.shape[1] / 64) if extra_indices is not None else 0)
    assert tuple(mid_out.shape) == (T, scratch_heads, splits, 512) and mid_out.dtype == torch.bfloat16
    assert tuple(mid_lse.shape) == (T, scratch_heads, splits) and q.dtype == torch.bfloat16
    bs, kv_cache = _paged_kv(kv_cache)
    extra_bs, extra_kv_cache = _paged_kv(extra_kv_cache) if extra_kv_cache is not None else (None, None)
    out, lse = dsv4ops.reference.sparse_mla_decode(   # the sink scales the output before its rounding
        q, kv_cache, indices, topk_length, layout="fp8_ds_mla", block_size=bs, softmax_scale=sm_scale,
        attn_sink=attn_sink, extra_kv_cache=extra_kv_cache, extra_indices=extra_indices,
        extra_topk_lens=extra_topk_length, extra_block_size=extra_bs)
    lse = torch.where(lse == float("inf"), float("-inf"), lse)
    if attn_sink is not None:
        lse = torch.logaddexp(lse, attn_sink[None, :])
    output.copy_(out)
    out_lse.copy_(lse / math.log(2.0) * lse_scale)
    return output


def _paged_kv(cache):
    """attention_validation.h parse_paged_kv_layout, 2-D case: [num_pages, W] uint8 with W % 584 == 0,
    stride(0) >= W and stride(0) % 16 == 0. Returns (rows per page, the full pages behind the view)."""
    assert cache.dtype == torch.uint8 and cache.dim() == 2 and cache.stride(1) == 1
    W = cache.shape[1]
    assert W % 584 == 0, "block width must be divisible by bytes_per_token"
    assert cache.stride(0) >= W and cache.stride(0) % 16 == 0
    return W // 584, cache.as_strided((cache.shape[0], cache.stride(0)), (cache.stride(0), 1))


def top_k_ragged_transform(
    input: torch.Tensor,
    offsets: torch.Tensor,
    lengths: torch.Tensor,
    k: int,
    deterministic: bool = False,
    tie_break: int = 0,
    dsa_graph_safe: bool = False,
    row_starts: Optional[torch.Tensor] = None,
) -> torch.Tensor:
    """'For each row i: output_indices[i, j] = topk_indices[j] + offsets[i]'; top-k over
    [row_starts[i], row_starts[i] + lengths[i]); 'Positions beyond actual length are set to -1'."""
    assert input.is_contiguous() and offsets.dtype == lengths.dtype == torch.int32
    starts = row_starts if row_starts is not None else torch.zeros_like(lengths)
    local = dsv4ops.reference.indexer_topk(input.float(), k, row_starts=starts, row_ends=starts + lengths)
    return torch.where(local >= 0, local + offsets[:, None], -1).to(torch.int32)


# The functions the adapters call, by vendor module path (used by the signature drift test).
CALLED = {
    "flashinfer.mla:trtllm_batch_decode_sparse_mla_dsv4": trtllm_batch_decode_sparse_mla_dsv4,
    "flashinfer.mla._sparse_mla_sm120:sparse_mla_sm120_decode_dsv4": sparse_mla_sm120_decode_dsv4,
    "flashinfer.topk:top_k_ragged_transform": top_k_ragged_transform,
}


def install(monkeypatch, wrap=None):
    """Put the fake ``flashinfer`` package (and the submodules the adapters import) in sys.modules;
    ``wrap(path, fn)`` may wrap each called function."""
    root = types.ModuleType("flashinfer")
    mla = types.ModuleType("flashinfer.mla")
    sm120 = types.ModuleType("flashinfer.mla._sparse_mla_sm120")
    topk = types.ModuleType("flashinfer.topk")
    w = wrap or (lambda path, fn: fn)
    mla.trtllm_batch_decode_sparse_mla_dsv4 = w("flashinfer.mla:trtllm_batch_decode_sparse_mla_dsv4",
                                                trtllm_batch_decode_sparse_mla_dsv4)
    sm120.sparse_mla_sm120_decode_dsv4 = w("flashinfer.mla._sparse_mla_sm120:sparse_mla_sm120_decode_dsv4",
                                           sparse_mla_sm120_decode_dsv4)
    topk.top_k_ragged_transform = w("flashinfer.topk:top_k_ragged_transform", top_k_ragged_transform)
    root.mla, root.topk, mla._sparse_mla_sm120 = mla, topk, sm120
    for name, module in (("flashinfer", root), ("flashinfer.mla", mla), ("flashinfer.mla._sparse_mla_sm120", sm120),
                         ("flashinfer.topk", topk)):
        monkeypatch.setitem(sys.modules, name, module)
