"""DeepGEMM entry points used by backends/deepgemm, both paged-logits and prefill-logits API generations,
with the documented argument contract (docs/ops.md §3, §4, §11; DeepGEMM README).

The prefill logits fakes follow deepseek-ai/DeepGEMM ``csrc/apis/attention.hpp`` (commit
0274ad7b911b99b4eb6f8d796403811cf1e18f3d: ``fp8_fp4_mqa_logits`` and the legacy wrapper
``fp8_mqa_logits``; SM90 kernel ``deep_gemm/include/deep_gemm/impls/sm90_fp8_mqa_logits.cuh``), with the
parameter lists of the tokenspeed-deepgemm 2.5.0.post20260604 wheel's ``deep_gemm/_C.pyi``."""
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


def _mqa_logits(q, kv, weights, ks, ke, clean_logits, max_seqlen_k):
    """[M, N] view of a [align(M, 128 / H), align(N + 256, 256)] allocation (not contiguous); columns
    outside [ks, ke) hold garbage, or -inf with clean_logits (max_seqlen_k = 0, the form adapted)."""
    k, k_sf = kv
    M, H, D = q.shape
    assert q.dtype == torch.float8_e4m3fn and q.is_contiguous() and D in (64, 128) and H in (32, 64), (q.dtype, q.shape)
    assert k.dtype == q.dtype and k.is_contiguous() and k.shape[1] == D
    assert k_sf.dtype == torch.float32 and k_sf.is_contiguous() and k_sf.shape == (k.shape[0],)
    assert weights.dtype == torch.float32 and weights.shape == (M, H) and weights.stride(1) == 1
    assert all(t.data_ptr() % 16 == 0 for t in (q, k, k_sf, weights)), "TMA descriptors need 16-byte alignment"
    for t in (ks, ke):
        assert t.dtype == torch.int32 and t.is_contiguous() and t.shape == (M,)
    assert max_seqlen_k == 0, "the compressed-logits form is not adapted"
    N = k.shape[0]
    buf = torch.full(((M + 127) // 128 * 128, (N + 256 + 255) // 256 * 256), 123.0)
    out = buf[:M, :N]
    ref = dsv4ops.reference.mqa_logits(q, k, k_sf, weights, ks, ke, clean=True)
    out.copy_(ref if clean_logits else torch.where(ref == float("-inf"), 123.0, ref))
    return out


def fp8_fp4_mqa_logits(q, kv, weights, cu_seq_len_k_start, cu_seq_len_k_end, clean_logits=True, max_seqlen_k=0,
                       logits_dtype=None):
    q_fp, q_sf = q
    assert q_sf is None and logits_dtype in (None, torch.float32)
    return _mqa_logits(q_fp, kv, weights, cu_seq_len_k_start, cu_seq_len_k_end, clean_logits, max_seqlen_k)


def fp8_mqa_logits(q, kv, weights, cu_seq_len_k_start, cu_seq_len_k_end, clean_logits=True, max_seqlen_k=0):
    return _mqa_logits(q, kv, weights, cu_seq_len_k_start, cu_seq_len_k_end, clean_logits, max_seqlen_k)


# The functions the adapters call whose parameter lists are copied from the release (signature drift test).
CALLED = {
    "deep_gemm:fp8_fp4_mqa_logits": fp8_fp4_mqa_logits,
    "deep_gemm:fp8_mqa_logits": fp8_mqa_logits,
}


def install(monkeypatch, generation="new", wrap=None):
    """``wrap(path, fn)`` may wrap each function named in CALLED."""
    mod = types.ModuleType("deep_gemm")
    mod.get_paged_mqa_logits_metadata = get_paged_mqa_logits_metadata
    mod.fp8_einsum = fp8_einsum
    if generation == "new":
        mod.fp8_fp4_paged_mqa_logits = fp8_fp4_paged_mqa_logits
        mod.fp8_fp4_mqa_logits = fp8_fp4_mqa_logits
    else:
        mod.fp8_paged_mqa_logits = fp8_paged_mqa_logits
        mod.fp8_mqa_logits = fp8_mqa_logits
    for path, fn in CALLED.items():
        name = path.partition(":")[2]
        if wrap and hasattr(mod, name):
            setattr(mod, name, wrap(path, fn))
    monkeypatch.setitem(sys.modules, "deep_gemm", mod)
