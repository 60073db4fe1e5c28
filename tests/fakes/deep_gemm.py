"""DeepGEMM entry points used by backends/deepgemm, one fake module per API generation, with the documented
argument contract (docs/ops.md §3, §4, §11; DeepGEMM README).

Parameter lists are copied from the wheels' ``deep_gemm/_C.pyi``: generation "2.5" and "legacy" from
tokenspeed-deepgemm 2.5.0.post20260604 (which declares both name sets), "2.8.0" from 2.8.0.post20260924
(.post20260910 declares the same), "2.8" from 2.8.2.post20261020.
Semantics: the 2.5 prefill logits follow deepseek-ai/DeepGEMM ``csrc/apis/attention.hpp`` at commit
0274ad7b911b99b4eb6f8d796403811cf1e18f3d (SM90 kernel ``sm90_fp8_mqa_logits.cuh``); the 2.8 ones the
host checks of the 2.8.2 wheel's ``deep_gemm/csrc/apis/attention.hpp`` and the store rule of its
``include/deep_gemm/impls/sm90_fp8_mqa_logits.cuh`` (``logits[q, kv - ks[q]]`` for ``ks <= kv < ke``). The
arch (SM90 / SM100) is read from the simulated platform; the SM100 recipe (MX scales, bf16) is checked
for its host contract but not computed, except the 2.8 line's fp8_einsum with recipe (1, 32, 32) (its scales
packed to UE8M0 as ``csrc/jit_kernels/impls/smxx_layout.hpp`` does)."""
import sys
import types
from typing import Optional

import torch

import dsv4ops
from dsv4ops.backend_support import sm_major
from dsv4ops.platform import current_simulation
from dsv4ops.quant import ue8m0_to_float


def _arch_major() -> int:
    sim = current_simulation()
    return sm_major(sim.arch) if sim is not None else 9


def _sm90_only(q_sf) -> None:
    """attention.hpp: MX q scales exactly on SM100; only the SM90 recipe is computed here."""
    major = _arch_major()
    assert (q_sf is not None) == (major == 10), "q scales: MX (int32) on SM100, None on SM90"
    assert major == 9, "the SM100 recipe is not modelled"


PACKED_FP4 = torch.int8            # 2.8.2 csrc/utils/math.hpp: kPackedFP4 = torch::kInt8


def get_paged_mqa_logits_metadata(context_lens, block_kv, num_sms, indices=None):
    """2.8.2 attention.hpp: 2-D int32 contiguous lengths; SM100 varlen only (``indices`` int32 [B], 8-byte
    aligned; next_n 1; block_kv 32, 64 or 128), SM90 no ``indices`` and block_kv 64."""
    assert context_lens.dim() == 2 and context_lens.dtype == torch.int32 and context_lens.is_contiguous()
    assert num_sms > 0
    if _arch_major() == 10:
        assert indices is not None and context_lens.shape[1] == 1 and block_kv in (32, 64, 128)
        assert indices.dim() == 1 and indices.shape[0] == context_lens.shape[0] and indices.dtype == torch.int32
        assert indices.is_contiguous() and indices.data_ptr() % 8 == 0
    else:
        assert indices is None and block_kv == 64, "SM90: no varlen indices, block_kv 64"
    return torch.zeros(num_sms + 1, 2, dtype=torch.int32)


def _check_q_and_weights(q_fp, q_sf, weights, rows: int):
    """2.8.2 ``check_mqa_logits_q_and_weights``: packed FP4 (int8, D/2 bytes) needs MX scales; MX scales
    (int32, one per (row, head), contiguous) exactly on SM100; weights [rows, H] with stride 1 and a
    16-byte row stride, bf16 on SM100, fp32 on SM90. Returns (is_fp4, head_dim)."""
    is_fp4 = q_fp.dtype == PACKED_FP4
    assert not is_fp4 or q_sf is not None
    assert q_fp.is_contiguous() and q_fp.dtype == (PACKED_FP4 if is_fp4 else torch.float8_e4m3fn), q_fp.dtype
    head_dim = q_fp.shape[-1] * (2 if is_fp4 else 1)
    assert head_dim in (64, 128) or (not is_fp4 and head_dim == 32)
    assert (q_sf is not None) == (_arch_major() == 10), "q scales: MX (int32) on SM100, None on SM90"
    if q_sf is not None:
        assert q_sf.shape == q_fp.shape[:-1] and q_sf.is_contiguous() and q_sf.dtype == torch.int32
    assert weights.shape == (rows, q_fp.shape[-2]) and weights.stride(1) == 1
    assert weights.stride(0) * weights.element_size() % 16 == 0
    assert weights.dtype == (torch.bfloat16 if _arch_major() == 10 else torch.float32)
    return is_fp4, head_dim


def _check_paged_28(q, kv_cache, weights, context_lens, block_table, schedule_meta, indices):
    """2.8.2 ``fp8_fp4_paged_mqa_logits`` host checks (both archs)."""
    q_fp, q_sf = q
    B, next_n, H, _ = q_fp.shape
    assert next_n >= 1
    is_fp4, head_dim = _check_q_and_weights(q_fp, q_sf, weights, B * next_n)
    _, block_kv, heads_kv, with_sf = kv_cache.shape
    assert block_kv in ((32, 64, 128) if _arch_major() == 10 else (64,))
    sf_bytes = 4
    assert heads_kv == 1 and with_sf == (head_dim // 2 if is_fp4 else head_dim) + sf_bytes
    assert kv_cache.stride(1) == with_sf and kv_cache.stride(3) == 1 and kv_cache.dtype == torch.uint8
    assert kv_cache.stride(0) % sf_bytes == 0
    assert block_table.shape[0] == B and block_table.stride(1) == 1 and block_table.dtype == torch.int32
    assert (indices is not None) == (_arch_major() == 10)
    if indices is not None:
        assert next_n == 1 and indices.shape == (B,) and indices.is_contiguous() and indices.dtype == torch.int32
    assert schedule_meta.shape[1] == 2 and schedule_meta.is_contiguous() and schedule_meta.dtype == torch.int32
    assert context_lens.shape == (B, next_n) and context_lens.is_contiguous() and context_lens.dtype == torch.int32
    if _arch_major() == 9:
        assert q_fp.dtype == torch.float8_e4m3fn and H in (32, 64)


def _logits(q, kv_cache, weights, context_lens, block_tables, max_len):
    """DG ref_fp8_paged_mqa_logits: 2-D lengths, t < context_lens[b, j]; tail not cleaned (garbage)."""
    assert kv_cache.shape[1] == 64 and kv_cache.shape[-1] == 132 and block_tables.stride(-1) == 1
    assert weights.dtype == torch.float32 and q.shape[2] in (32, 64)
    out = dsv4ops.reference.paged_mqa_logits(q, kv_cache, weights, context_lens, block_tables, max_len)
    return torch.where(out == float("-inf"), 123.0, out)      # 'columns past the length are not cleaned'


def fp8_fp4_paged_mqa_logits_25(q, fused_kv_cache, weights, context_lens, block_table, schedule_meta,
                                max_context_len, clean_logits=False, logits_dtype=None, indices=None):
    q_fp, q_sf = q
    assert q_sf is None and q_fp.dtype == torch.float8_e4m3fn and indices is None and logits_dtype is None
    assert not clean_logits, "the adapter cleans the tail itself"
    return _logits(q_fp, fused_kv_cache, weights, context_lens, block_table, max_context_len)


def fp8_fp4_paged_mqa_logits_28(q, fused_kv_cache, weights, context_lens, block_table, schedule_meta,
                                max_context_len, indices=None):
    """2.8: the host checks of both archs; SM90 computed (fp32 logits, tail not cleaned)."""
    _check_paged_28(q, fused_kv_cache, weights, context_lens, block_table, schedule_meta, indices)
    _sm90_only(q[1])
    return _logits(q[0], fused_kv_cache, weights, context_lens, block_table, max_context_len)


def fp8_paged_mqa_logits(q, fused_kv_cache, weights, context_lens, block_table, schedule_meta, max_context_len,
                         clean_logits=False, indices=None):
    assert indices is None
    out = _logits(q, fused_kv_cache, weights, context_lens, block_table, max_context_len)
    if clean_logits:
        out = dsv4ops.reference.paged_mqa_logits(q, fused_kv_cache, weights, context_lens, block_table,
                                                 max_context_len)
    return out


def _fp8_einsum(expr, a, b, d, c, recipe):
    """SM90 recipe: fp32 scales, sfa MN-major and TMA-aligned: strides (1, (K/128)*T_al, T_al)."""
    (a, sfa), (b, sfb) = a, b
    B = a.shape[0]
    t_al = (B + 3) // 4 * 4
    assert expr == "bhr,hdr->bhd" and recipe == (1, 128, 128) and c is None
    assert sfa.stride() == (1, sfa.shape[2] * t_al, t_al), sfa.stride()
    d.copy_(dsv4ops.reference.fp8_einsum(expr, a, sfa, b, sfb, out_dtype=d.dtype))


def _ue8m0(sf: torch.Tensor) -> torch.Tensor:
    """What SM100's packing keeps of fp32 scales: the exponent byte (``sf.view(int32) >> 23``), as fp32."""
    return ue8m0_to_float((sf.contiguous().view(torch.int32) >> 23).to(torch.uint8))


def _sm100_fp8_einsum(expr, a, b, d, c, recipe):
    """2.8 einsum.hpp's fp8_bmm on SM100 for ``bhr,hdr->bhd`` (a and its scales permuted to [H, B, ...]):
    fp8 operands with a unit stride in K, fp32 scales of ``check_sf_layout``'s shapes ([H, B, R/gran_k],
    [H, ceil(D/gran_mn_b), R/gran_k]) for gran_k 32 or 128, packed to UE8M0 by keeping their exponent
    bytes. Only the recipe (1, 32, 32) the adapter passes, bf16 d and no c are modelled."""
    (a, sfa), (b, sfb) = a, b
    assert expr == "bhr,hdr->bhd" and c is None and recipe == (1, 32, 32), (expr, recipe)
    gran_mn_b, gran_k = recipe[1:]
    B, H, R = a.shape
    D = b.shape[1]
    assert a.dtype == b.dtype == torch.float8_e4m3fn and a.stride(2) == 1 and b.stride(2) == 1
    assert d.dtype == torch.bfloat16 and d.shape == (B, H, D) and d.stride(2) == 1
    assert sfa.dtype == sfb.dtype == torch.float32
    assert sfa.shape == (B, H, -(-R // gran_k)), (sfa.shape, R)
    assert sfb.shape == (H, -(-D // gran_mn_b), -(-R // gran_k)), (sfb.shape, D, R)
    d.copy_(dsv4ops.reference.fp8_einsum(expr, a, _ue8m0(sfa), b, _ue8m0(sfb), out_dtype=d.dtype))


def fp8_einsum_25(expr, a, b, d, c=None, recipe=(1, 128, 128)):
    assert _arch_major() == 9, "2.5's SM100 einsum recipe is not modelled"
    _fp8_einsum(expr, a, b, d, c, recipe)


def fp8_einsum_280(expr, a, b, d, c=None, recipe=(1, 128, 128)):
    """2.8.0 (2.5's parameters; einsum.hpp's fp8_bmm as 2.8.2's but for the epilogue). SM90: fp8_bmm
    asserts gran_k 128 for both operands (the (1, 32, 32) recipe is refused)."""
    if _arch_major() == 10:
        _sm100_fp8_einsum(expr, a, b, d, c, recipe)
    else:
        _fp8_einsum(expr, a, b, d, c, recipe)


def fp8_einsum_28(expr, a, b, d, c=None, recipe=(1, 128, 128), epilogue_class=None):
    """2.8.2: 2.8.0's, plus ``epilogue_class`` (not passed)."""
    assert epilogue_class is None
    fp8_einsum_280(expr, a, b, d, c, recipe)


def _check_mqa_inputs(q, kv, weights, ks, ke):
    """The SM90 host checks: OCP fp8 q / keys, 32 or 64 heads, fp32 per-key scales, fp32 weights with a
    16-byte row stride, int32 ranges; TMA descriptors need 16-byte aligned bases."""
    k, k_sf = kv
    M, H, D = q.shape
    assert q.dtype == torch.float8_e4m3fn and q.is_contiguous() and D in (64, 128) and H in (32, 64), (q.dtype, q.shape)
    assert k.dtype == q.dtype and k.is_contiguous() and k.shape[1] == D
    assert k_sf.dtype == torch.float32 and k_sf.is_contiguous() and k_sf.shape == (k.shape[0],)
    assert weights.dtype == torch.float32 and weights.shape == (M, H) and weights.stride(1) == 1
    assert weights.stride(0) * 4 % 16 == 0
    assert all(t.data_ptr() % 16 == 0 for t in (q, k, k_sf, weights)), "TMA descriptors need 16-byte alignment"
    for t in (ks, ke):
        assert t.dtype == torch.int32 and t.is_contiguous() and t.shape == (M,)


def _padded(M: int, N: int) -> torch.Tensor:
    """A [M, N] view of a [align(M, 128), align(N + 256, 256)] allocation of garbage (not contiguous)."""
    return torch.full(((M + 127) // 128 * 128, (N + 256 + 255) // 256 * 256), 123.0)[:M, :N]


def _mqa_logits(q, kv, weights, ks, ke, clean_logits, max_seqlen_k):
    """2.5 / legacy, the form adapted (max_seqlen_k = 0): absolute columns, outside [ks, ke) garbage or,
    with clean_logits, -inf."""
    _check_mqa_inputs(q, kv, weights, ks, ke)
    assert max_seqlen_k == 0, "the compressed-logits form is not adapted on 2.5"
    out = _padded(q.shape[0], kv[0].shape[0])
    ref = dsv4ops.reference.mqa_logits(q, kv[0], kv[1], weights, ks, ke, clean=True)
    out.copy_(ref if clean_logits else torch.where(ref == float("-inf"), 123.0, ref))
    return out


def fp8_fp4_mqa_logits_25(q, kv, weights, cu_seq_len_k_start, cu_seq_len_k_end, clean_logits=True, max_seqlen_k=0,
                          logits_dtype=None):
    q_fp, q_sf = q
    assert q_sf is None and logits_dtype in (None, torch.float32)
    return _mqa_logits(q_fp, kv, weights, cu_seq_len_k_start, cu_seq_len_k_end, clean_logits, max_seqlen_k)


def fp8_fp4_mqa_logits_280(q, kv, weights, cu_seq_len_k_start, cu_seq_len_k_end, clean_logits=True, max_seqlen_k=0,
                           logits_dtype=None, schedule_meta=None):
    """2.8.0: 2.5's, plus ``schedule_meta`` (SM100 only; attention.hpp asserts it absent on SM90)."""
    assert schedule_meta is None
    return fp8_fp4_mqa_logits_25(q, kv, weights, cu_seq_len_k_start, cu_seq_len_k_end, clean_logits, max_seqlen_k,
                                 logits_dtype)


def fp8_mqa_logits(q, kv, weights, cu_seq_len_k_start, cu_seq_len_k_end, clean_logits=True, max_seqlen_k=0):
    return _mqa_logits(q, kv, weights, cu_seq_len_k_start, cu_seq_len_k_end, clean_logits, max_seqlen_k)


def _check_mqa_28(q_fp, q_sf, kv, weights, ks, ke):
    """2.8.2 ``fp8_fp4_mqa_logits`` host checks (both archs): keys of q's kind (packed FP4 int8 [S, D/2] or
    e4m3 [S, D]) contiguous, their scales [S] contiguous, int32 MX with MX q scales, else fp32."""
    k, k_sf = kv
    _check_q_and_weights(q_fp, q_sf, weights, q_fp.shape[0])
    assert k.shape[1] == q_fp.shape[2] and k.is_contiguous() and k.dtype == q_fp.dtype
    assert k_sf.shape == (k.shape[0],) and k_sf.is_contiguous()
    assert k_sf.dtype == (torch.int32 if q_sf is not None else torch.float32)
    for t in (ks, ke):
        assert t.shape == (q_fp.shape[0],) and t.is_contiguous() and t.dtype == torch.int32


def fp8_fp4_mqa_logits_28(q, kv, weights, cu_seq_len_k_start, cu_seq_len_k_end, max_seqlen_k: int,
                          schedule_meta: Optional[torch.Tensor] = None):
    """2.8: compressed rows only, ``[M, max_seqlen_k]`` (a view of a row-padded allocation): column c is key
    ``ks + c`` for ``c < ke - ks``; the rest is not cleaned. SM90: no schedule_meta; max_seqlen_k > 0 and
    (the kernel stores past it otherwise) at least every row's span."""
    q_fp, q_sf = q
    ks, ke = cu_seq_len_k_start, cu_seq_len_k_end
    _check_mqa_28(q_fp, q_sf, kv, weights, ks, ke)
    _sm90_only(q_sf)
    _check_mqa_inputs(q_fp, kv, weights, ks, ke)
    assert schedule_meta is None and isinstance(max_seqlen_k, int) and not isinstance(max_seqlen_k, bool)
    assert max_seqlen_k > 0 and int((ke - ks).max()) <= max_seqlen_k, (max_seqlen_k, ke - ks)
    ref = dsv4ops.reference.mqa_logits(q_fp, kv[0], kv[1], weights, ks, ke, clean=True)
    out = _padded(q_fp.shape[0], max_seqlen_k)
    for i in range(q_fp.shape[0]):
        span = int(ke[i] - ks[i])
        out[i, :span] = ref[i, int(ks[i]):int(ke[i])]
    return out


# name -> fake, per API generation (backends/deepgemm.api_generation tells them apart)
GENERATIONS = {
    "2.8": {"get_paged_mqa_logits_metadata": get_paged_mqa_logits_metadata,
            "fp8_fp4_paged_mqa_logits": fp8_fp4_paged_mqa_logits_28, "fp8_fp4_mqa_logits": fp8_fp4_mqa_logits_28,
            "fp8_einsum": fp8_einsum_28},
    "2.8.0": {"get_paged_mqa_logits_metadata": get_paged_mqa_logits_metadata,
              "fp8_fp4_paged_mqa_logits": fp8_fp4_paged_mqa_logits_25, "fp8_fp4_mqa_logits": fp8_fp4_mqa_logits_280,
              "fp8_einsum": fp8_einsum_280},
    "2.5": {"get_paged_mqa_logits_metadata": get_paged_mqa_logits_metadata,
            "fp8_fp4_paged_mqa_logits": fp8_fp4_paged_mqa_logits_25, "fp8_fp4_mqa_logits": fp8_fp4_mqa_logits_25,
            "fp8_einsum": fp8_einsum_25},
    "legacy": {"get_paged_mqa_logits_metadata": get_paged_mqa_logits_metadata,
               "fp8_paged_mqa_logits": fp8_paged_mqa_logits, "fp8_mqa_logits": fp8_mqa_logits,
               "fp8_einsum": fp8_einsum_25},
}


def called(generation: str) -> dict:
    """``deep_gemm:<name>`` -> fake, for the signature drift tests."""
    return {f"deep_gemm:{name}": fn for name, fn in GENERATIONS[generation].items()}


def install(monkeypatch, generation="2.5", wrap=None):
    """Put a fake ``deep_gemm`` of ``generation`` in sys.modules; ``wrap(path, fn)`` may wrap each function."""
    mod = types.ModuleType("deep_gemm")
    for path, fn in called(generation).items():
        setattr(mod, path.partition(":")[2], wrap(path, fn) if wrap else fn)
    monkeypatch.setitem(sys.modules, "deep_gemm", mod)
