"""dsv4ops ops -> vllm-xpu-kernels (schemas from its csrc/xpu/torch_bindings.cpp and
csrc/torch_bindings.cpp, unchanged from v0.1.11 to the 0.1.16.2 wheel).

qnorm_rope_kv_insert -> ``torch.ops._xpu_C.deepseek_qnorm_rope_kv_insert(Tensor! q, Tensor kv,
Tensor! cache, Tensor slot_mapping, Tensor position_ids, Tensor cos_sin_cache, float eps,
int block_size, str kv_cache_dtype) -> ()``: weightless RMSNorm + GPT-J RoPE on q in place, RoPE on
kv and insert at ``slot_mapping`` (negative = skip). The kernel reads ``slot_mapping[t]`` for every
token ``t < q.size(0)``, so a shorter slot_mapping (T' < T) is padded with -1 here. With ``out``
the query is copied into ``out`` and normalized there (the kernel has no out parameter).

paged_mqa_logits -> ``torch.ops._xpu_C.fp8_paged_mqa_logits(Tensor q_fp8, Tensor kv_cache_fp8,
Tensor weights, Tensor context_lens, Tensor block_tables, Tensor? schedule_metadata,
int max_model_len) -> Tensor``: the cache is viewed per page as ``bs*128`` fp8 bytes then ``bs*4``
fp32 scales, exactly the dsv4ops index cache. The kernel takes 1-D lengths only (row
``b*next_n + j`` sees ``len_b - next_n + j + 1`` keys, our causal rule) and builds q / weights /
block-table strides from their shapes (contiguous inputs). 2-D lengths are served as ``B * next_n``
requests of one query each (q and weights are the same memory; the block table rows are repeated).
It returns a new, always -inf-cleaned ``[B * next_n, max_model_len]`` tensor and requires
``max_model_len > 0``.

indexer_topk -> ``torch.ops._C.top_k_per_row_prefill(Tensor logits, Tensor rowStarts,
Tensor rowEnds, Tensor! indices, int numRows, int stride0, int stride1, int topK) -> ()``, which
returns row-local indices with -1 past each row's count and honours both logits strides. The decode
entry is not used: it does not clamp ``seq_len - next_n + j + 1`` and writes before the row when
that is negative; the prefill entry gets the clamped ends instead.
"""
from __future__ import annotations

import torch

from dsv4ops.backend_support import dense, topk_output
from dsv4ops.rows import row_bounds


def qnorm_rope_kv_insert(a):
    T = a.q.shape[0]
    target = a.q if a.out is None else a.out.copy_(a.q)
    if T == 0:
        return target
    slots = dense(a.slot_mapping)
    if slots.shape[0] < T:
        slots = torch.full((T,), -1, dtype=torch.int64, device=a.q.device)
        slots[: a.slot_mapping.shape[0]] = a.slot_mapping
    torch.ops._xpu_C.deepseek_qnorm_rope_kv_insert(target, dense(a.kv), a.kv_cache, slots, dense(a.positions),
                                                   a.cos_sin_cache, float(a.eps), int(a.block_size), a.layout.name)
    return target


def paged_mqa_logits(a):
    q, weights = a.q, a.weights
    B, next_n, H, D = q.shape
    rows = B * next_n
    if rows == 0 or a.max_context_len == 0:
        result = torch.empty(rows, a.max_context_len, dtype=torch.float32, device=q.device) if a.out is None else a.out
        return result.fill_(float("-inf"))
    q, weights, table, lens = q.contiguous(), weights.contiguous(), a.block_table.contiguous(), dense(a.context_lens)
    if lens.dim() == 2:                                 # one request per row: [B*next_n, 1, H, D]
        q = q.view(rows, 1, H, D)
        lens = lens.reshape(rows).contiguous()
        table = table.repeat_interleave(next_n, dim=0)
    logits = torch.ops._xpu_C.fp8_paged_mqa_logits(q, a.kv_cache, weights, lens, table, None, int(a.max_context_len))
    if a.out is None:
        return logits
    return a.out.copy_(logits)


def indexer_topk(a):
    R = a.logits.shape[0]
    result = topk_output(a)
    if R == 0:
        return result
    starts, ends = row_bounds(a.row_starts, a.row_ends, a.seq_lens, a.next_n)
    torch.ops._C.top_k_per_row_prefill(a.logits, starts.to(torch.int32), ends.to(torch.int32), result, R,
                                       a.logits.stride(0), a.logits.stride(1), a.k)
    return result
