"""AITER entry points used by backends/aiter, with the semantics their docstrings state."""
import sys
import types

import torch

from dsv4ops import formats


def _rows(pool, slots, kv_scale):
    """Dequantized fp32 rows of a block pool at global slot ids, classified by record width as
    AITER does: 584-byte uint8 records (fp8_dsv4_mla), 512 bf16, or 512 fp8 with a [1] kv_scale."""
    nb, bs, width = pool.shape
    if pool.dtype == torch.uint8 and width == 584:
        cache = pool.as_strided((nb, pool.stride(0)), (pool.stride(0), 1))      # the page bytes behind the view
        return formats.read_kv(cache, "fp8_ds_mla", bs, slots)
    flat = pool.reshape(nb * bs, width)
    if pool.dtype == torch.bfloat16:
        return flat[slots].float()
    assert kv_scale is not None and kv_scale.numel() == 1 and kv_scale.dtype == torch.float32
    return flat[slots].float() * kv_scale


def _segment(pool, indptr, indices, kv_scale, T):
    """CSR stream -> rows [T, n, 512] and mask (has_invalid: -1 entries are masked)."""
    assert indptr.dtype == torch.int32 and indptr.numel() == T + 1 and indices.dtype == torch.int32
    counts = (indptr[1:] - indptr[:-1]).tolist()
    n = max(counts + [0])
    idx = torch.full((T, n), -1, dtype=torch.int64)
    for t in range(T):
        idx[t, : counts[t]] = indices[indptr[t]: indptr[t + 1]]
    valid = idx != -1
    rows = _rows(pool, torch.where(valid, idx, 0), kv_scale)
    return torch.where(valid[..., None], rows, 0.0), valid


def sparse_mla_fwd(q, kv_buffer, kv_indptr, kv_indices, softmax_scale, *, kv_scale=None, kv_lora_rank=512,
                   qk_rope_head_dim=64, has_invalid=False, q_scale=None, out=None, return_lse=False,
                   attn_sink=None, extra_kv=None, extra_indptr=None, extra_indices=None, **unused):
    """'attn_sink: exp(sink) joins the softmax denominator (and the LSE) as a virtual key'; V is
    the whole 512-wide row for DeepSeek-V4; returns (out [C, H, 512] bf16, None)."""
    assert has_invalid and not return_lse and kv_buffer.dim() == 3
    T, H, D = q.shape
    keys, valid = _segment(kv_buffer, kv_indptr, kv_indices, kv_scale, T)
    if extra_kv is not None:
        k2, v2 = _segment(extra_kv, extra_indptr, extra_indices, kv_scale, T)
        keys, valid = torch.cat([keys, k2], 1), torch.cat([valid, v2], 1)
    qf = q.float() * (q_scale if q.dtype != torch.bfloat16 else 1.0)
    s = torch.einsum("thd,tkd->thk", qf, keys) * softmax_scale
    s = s.masked_fill(~valid[:, None, :], float("-inf"))
    m = s.amax(-1, keepdim=True)                        # running max over the keys; the sink joins after
    m = torch.where(m == float("-inf"), 0.0, m)
    p = torch.exp(s - m)
    denom = p.sum(-1, keepdim=True)
    if attn_sink is not None:
        denom = denom + torch.exp(attn_sink[None, :, None] - m)
    o = torch.einsum("thk,tkd->thd", p, keys) / torch.where(denom == 0, 1.0, denom)
    out.copy_(o.to(torch.bfloat16))
    return out, None


def top_k_per_row_decode(logits, next_n, seqLens, indices, numRows, stride0, stride1, k=2048, stable=False):
    """Decode rows r = b * next_n + j see [0, L_b - next_n + j + 1); writes indices in place."""
    assert seqLens.dim() == 1 and logits.stride(0) == stride0 and logits.stride(1) == stride1
    j = torch.arange(next_n).repeat(seqLens.shape[0])
    ends = (seqLens.repeat_interleave(next_n) - next_n + j + 1).clamp_min(0)
    _select(logits, torch.zeros_like(ends), ends, indices, k)


def top_k_per_row_prefill(logits, rowStarts, rowEnds, indices, values, numRows, stride0, stride1, k=2048,
                          stable=False):
    assert values is None and logits.stride(0) == stride0
    _select(logits, rowStarts, rowEnds, indices, k)


def _select(logits, starts, ends, indices, k):
    """Largest logits of [start, end) per row; slots past the count are left as garbage (99),
    which the adapter must not pass on."""
    indices.fill_(99)
    for r in range(logits.shape[0]):
        s, e = int(starts[r]), int(ends[r])
        n = min(k, max(0, e - s))
        if n:
            indices[r, :n] = torch.topk(logits[r, s:e], n).indices.to(torch.int32)


def install(monkeypatch):
    names = ["aiter", "aiter.ops", "aiter.ops.triton", "aiter.ops.triton.attention",
             "aiter.ops.triton.attention.sparse_mla", "aiter.ops.topk"]
    modules = {name: types.ModuleType(name) for name in names}
    modules["aiter.ops.triton.attention.sparse_mla"].sparse_mla_fwd = sparse_mla_fwd
    modules["aiter.ops.topk"].top_k_per_row_decode = top_k_per_row_decode
    modules["aiter.ops.topk"].top_k_per_row_prefill = top_k_per_row_prefill
    for name, module in modules.items():
        parent, _, child = name.rpartition(".")
        if parent:
            setattr(modules[parent], child, module)
        monkeypatch.setitem(sys.modules, name, module)
