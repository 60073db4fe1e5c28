"""DeepGEMM entry points used by backends/deepgemm, both paged-logits API generations, with the
documented argument contract (docs/ops.md §3, §4; DeepGEMM README)."""
import sys
import types

import torch

import dsv4ops


def get_paged_mqa_logits_metadata(context_lens, block_kv, num_sms):
    assert context_lens.dim() == 2 and context_lens.dtype == torch.int32, "this build wants 2-D lengths"
    return torch.zeros(num_sms + 1, 2, dtype=torch.int32)


def _logits(q, kv_cache, weights, context_lens, block_tables, max_len):
    """DG ref_fp8_paged_mqa_logits: 2-D lengths, t < context_lens[b, j]; tail not cleaned (garbage)."""
    assert kv_cache.shape[1] == 64 and kv_cache.shape[-1] == 132 and block_tables.stride(-1) == 1
    out = dsv4ops.reference.paged_mqa_logits(q, kv_cache, weights, context_lens, block_tables, max_len)
    return torch.where(out == float("-inf"), 123.0, out)      # 'columns past the length are not cleaned'


def fp8_fp4_paged_mqa_logits(q_and_sf, kv_cache, weights, context_lens, block_tables, schedule_meta, max_model_len,
                             indices=None):
    q, q_sf = q_and_sf
    assert q_sf is None and q.dtype == torch.float8_e4m3fn
    return _logits(q, kv_cache, weights, context_lens, block_tables, max_model_len)


def fp8_paged_mqa_logits(q, kv_cache, weights, context_lens, block_tables, schedule_meta, max_context_len,
                         clean_logits):
    out = _logits(q, kv_cache, weights, context_lens, block_tables, max_context_len)
    if clean_logits:
        out = dsv4ops.reference.paged_mqa_logits(q, kv_cache, weights, context_lens, block_tables, max_context_len)
    return out


def fp8_einsum(expr, a_pair, b_pair, d, c=None, recipe=(1, 128, 128)):
    """SM90 recipe: fp32 scales, sfa MN-major and TMA-aligned: strides (1, (K/128)*T_al, T_al)."""
    (a, sfa), (b, sfb) = a_pair, b_pair
    B = a.shape[0]
    t_al = (B + 3) // 4 * 4
    assert expr == "bhr,hdr->bhd" and recipe == (1, 128, 128) and c is None
    assert sfa.stride() == (1, sfa.shape[2] * t_al, t_al), sfa.stride()
    d.copy_(dsv4ops.reference.fp8_einsum(expr, a, sfa, b, sfb, out_dtype=d.dtype))


def install(monkeypatch, generation="new"):
    mod = types.ModuleType("deep_gemm")
    mod.get_paged_mqa_logits_metadata = get_paged_mqa_logits_metadata
    mod.fp8_einsum = fp8_einsum
    if generation == "new":
        mod.fp8_fp4_paged_mqa_logits = fp8_fp4_paged_mqa_logits
    else:
        mod.fp8_paged_mqa_logits = fp8_paged_mqa_logits
    monkeypatch.setitem(sys.modules, "deep_gemm", mod)
