"""Fakes of the vllm-xpu-kernels ops that backends/xpu calls, registered as real torch ops (CPU
kernels) under the package's own namespaces and schema strings, so that the dispatcher checks the
adapter's arguments against the released schemas.

Source: vllm-project/vllm-xpu-kernels main @ 4543b580fecca68a7dd54ddaf6e444dc5f11a6a4; the schema
strings are byte-identical in the PyPI wheel vllm-xpu-kernels==0.1.16.2 (read from its .so files).
The schemas are copied; the bodies are our own plain-PyTorch models of the kernels:

- ``_xpu_C::deepseek_qnorm_rope_kv_insert``: csrc/xpu/sycl/deepseek_qnorm_rope_kv_insert.cpp
  (RMSNorm via rsqrt(mean(x^2) + eps) without weight, GPT-J RoPE with ``sin = cos + 32``; fp8_ds_mla
  writer ``fast_ceil_pow2(max(amax, 1e-4) * (1 / 448))`` and the integer e4m3 conversion
  ``fused_scale_to_fp8``, which returns 0 when ``v_exp + 7 < scale_exp`` and has no subnormals).
- ``_xpu_C::fp8_paged_mqa_logits``: csrc/xpu/mqa_logits/mqa_logits_interface.cpp
  (check_fp8_paged_mqa_inputs, page split ``[:, :bs*D]`` fp8 / ``[:, bs*D:]`` fp32) and
  xe_2/mqa_logits_xe2.cpp (Xe2 only, block_size == 64, output ``full(-inf)``, column ``c`` of row
  ``(b, j)`` written when ``c < len_b`` and ``c <= len_b - next_n + j``; dot * scale, ReLU, * weight).
- ``_C::top_k_per_row_prefill``: csrc/topk_per_row.cpp (row-local indices, -1 past the row's count).
"""
import sys
import types

import torch

from dsv4ops.platform import current_simulation

SCHEMAS = {
    "_xpu_C": {
        "deepseek_qnorm_rope_kv_insert": "deepseek_qnorm_rope_kv_insert(Tensor! q, Tensor kv, Tensor! cache, "
                                         "Tensor slot_mapping, Tensor position_ids, Tensor cos_sin_cache, "
                                         "float eps, int block_size, str kv_cache_dtype) -> ()",
        "fp8_paged_mqa_logits": "fp8_paged_mqa_logits(Tensor q_fp8, Tensor kv_cache_fp8, Tensor weights, "
                                "Tensor context_lens, Tensor block_tables, Tensor? schedule_metadata, "
                                "int max_model_len) -> Tensor",
        "is_xe2_arch": "is_xe2_arch(int device_index=-1) -> bool",
    },
    "_C": {
        "top_k_per_row_prefill": "top_k_per_row_prefill(Tensor logits, Tensor rowStarts, Tensor rowEnds, "
                                 "Tensor! indices, int numRows, int stride0, int stride1, int topK) -> ()",
        "top_k_per_row_decode": "top_k_per_row_decode(Tensor logits, int next_n, Tensor seq_lens, Tensor! indices, "
                                "int numRows, int stride0, int stride1, int topK) -> ()",
    },
}
XE2 = ("bmg", "lnl", "pvc", "xe2")


def _xe2() -> bool:
    sim = current_simulation()
    return sim is not None and sim.arch in XE2


def _bits(x):
    return x.to(torch.float32).contiguous().view(torch.int32).to(torch.int64) & 0xFFFFFFFF


def _fp8_bytes(vals, scale_exp):
    """fused_scale_to_fp8: divide by 2^(scale_exp - 127) in the exponent field, RNE on 3 mantissa bits."""
    bits = _bits(vals)
    sign, v_exp, v_mant = bits >> 31, (bits >> 23) & 0xFF, bits & 0x7FFFFF
    mant3, rem = v_mant >> 20, v_mant & 0xFFFFF
    mant3 = mant3 + ((rem > 0x80000) | ((rem == 0x80000) & ((mant3 & 1) == 1))).long()
    e4m3_exp = v_exp - scale_exp + 7 + (mant3 >> 3)
    result = (e4m3_exp << 3) | (mant3 & 7)
    result = torch.where(v_exp + 7 >= scale_exp, result, 0)
    return ((sign << 7) | (result & 0x7F)).to(torch.uint8)


def _rope(even, odd, cos, sin):
    return even * cos - odd * sin, even * sin + odd * cos


def deepseek_qnorm_rope_kv_insert(q, kv, cache, slot_mapping, position_ids, cos_sin_cache, eps, block_size,
                                  kv_cache_dtype):
    T, H, D = q.shape
    assert kv.size(1) == D, "kv head_dim must match q head_dim"
    assert D == 512 and cos_sin_cache.size(1) == 64, "Supported: head_dim=512, rope_dim=64"
    assert kv_cache_dtype in ("bf16", "fp8_ds_mla"), f"unsupported kv_cache_dtype {kv_cache_dtype!r}"
    assert q.dtype == kv.dtype == torch.bfloat16 and q.stride(2) == 1 and kv.stride(1) == 1
    assert slot_mapping.dtype == position_ids.dtype == torch.int64 and cos_sin_cache.dtype == torch.float32
    assert slot_mapping.numel() >= T, "slot_mapping[token_idx] is read for every token < q.size(0)"
    if T == 0:
        return
    cs = cos_sin_cache[position_ids]
    cos, sin = cs[:, :32], cs[:, 32:]
    x = q.float()
    rrms = torch.rsqrt((x * x).sum(-1, keepdim=True) / 512 + eps)
    e, o = _rope(x[..., 448::2] * rrms, x[..., 449::2] * rrms, cos[:, None], sin[:, None])
    q[..., :448] = (x[..., :448] * rrms).to(torch.bfloat16)
    q[..., 448::2], q[..., 449::2] = e.to(torch.bfloat16), o.to(torch.bfloat16)
    k = kv.float()
    ke, ko = _rope(k[:, 448::2], k[:, 449::2], cos, sin)
    rope = torch.stack([ke, ko], -1).reshape(T, 64).to(torch.bfloat16)
    for t in range(T):
        slot = int(slot_mapping[t])
        if slot < 0:
            continue
        blk, pos = slot // block_size, slot % block_size
        if kv_cache_dtype == "bf16":
            cache[blk, pos, :448] = kv[t, :448]
            cache[blk, pos, 448:] = rope[t]
            continue
        page = cache.as_strided((cache.stride(0),), (1,), cache.storage_offset() + blk * cache.stride(0))
        nope = kv[t, :448].float().view(7, 64)
        amax = nope.abs().amax(-1).clamp_min(1e-4)
        raw = _bits(amax * torch.tensor(1.0 / 448.0, dtype=torch.float32))
        raw = torch.where((raw & 0x7FFFFF) != 0, (raw + 0x800000) & 0xFF800000, raw)
        scale_exp = raw >> 23
        page[pos * 576: pos * 576 + 448] = _fp8_bytes(nope, scale_exp[:, None]).reshape(448)
        page[pos * 576 + 448: pos * 576 + 576] = rope[t].view(torch.uint8)
        page[block_size * 576 + pos * 8: block_size * 576 + pos * 8 + 7] = scale_exp.to(torch.uint8)
        page[block_size * 576 + pos * 8 + 7] = 0


def fp8_paged_mqa_logits(q_fp8, kv_cache_fp8, weights, context_lens, block_tables, schedule_metadata,
                         max_model_len):
    assert q_fp8.dim() == 4 and kv_cache_fp8.dim() == 4 and weights.dim() == 2
    assert context_lens.dim() == 1, "context_lens must be [batch_size]"
    assert block_tables.dim() == 2
    assert q_fp8.dtype == torch.float8_e4m3fn and kv_cache_fp8.dtype == torch.uint8
    assert weights.dtype == torch.float32 and context_lens.dtype == block_tables.dtype == torch.int32
    B, next_n, H, D = q_fp8.shape
    nb, bs = kv_cache_fp8.shape[:2]
    assert kv_cache_fp8.size(2) == 1 and kv_cache_fp8.size(3) == D + 4
    assert tuple(weights.shape) == (B * next_n, H) and context_lens.size(0) == B and block_tables.size(0) == B
    assert max_model_len > 0, "max_model_len must be > 0"
    if not _xe2():
        raise RuntimeError("Only XE2 paged mqa logits kernel is supported currently.")
    assert bs == 64, "fp8_paged_mqa_logits_xe2 currently only supports block_size == 64"
    assert q_fp8.is_contiguous() and weights.is_contiguous() and block_tables.is_contiguous(), \
        "strides are built from shapes"
    flat = kv_cache_fp8.reshape(nb, bs * (D + 4))
    vals = flat[:, : bs * D].contiguous().view(torch.float8_e4m3fn).view(nb, bs, D).float()
    scales = flat[:, bs * D:].contiguous().view(torch.float32).view(nb, bs)
    out = torch.full((B * next_n, max_model_len), float("-inf"))
    max_blocks = block_tables.shape[1]
    for b in range(B):
        L = int(context_lens[b])
        for c in range(min(L, max_model_len, max_blocks * bs)):
            page = int(block_tables[b, c // bs])
            if page < 0 or page >= nb:
                continue
            s = (q_fp8[b].float() @ vals[page, c % bs]) * scales[page, c % bs]         # [next_n, H]
            logit = (s.clamp_min(0) * weights[b * next_n: (b + 1) * next_n]).sum(-1)
            for j in range(next_n):
                if c <= L - next_n + j:
                    out[b * next_n + j, c] = logit[j]
    return out


def is_xe2_arch(device_index=-1):
    return _xe2()


def top_k_per_row_prefill(logits, rowStarts, rowEnds, indices, numRows, stride0, stride1, topK):
    assert logits.size(0) == numRows and logits.stride(0) == stride0 and logits.stride(1) == stride1
    assert indices.size(0) == numRows and indices.size(1) == topK and indices.dtype == torch.int32
    assert logits.dtype == torch.float32 and rowStarts.dtype == rowEnds.dtype == torch.int32
    indices.fill_(-1)
    for r in range(numRows):
        s, e = int(rowStarts[r]), int(rowEnds[r])
        n = min(topK, max(0, e - s))
        if n:
            indices[r, :n] = torch.topk(logits[r, s:e], n).indices.to(torch.int32)


def top_k_per_row_decode(logits, next_n, seq_lens, indices, numRows, stride0, stride1, topK):
    raise AssertionError("the adapter uses top_k_per_row_prefill (decode does not clamp negative row ends)")


IMPLS = {"deepseek_qnorm_rope_kv_insert": deepseek_qnorm_rope_kv_insert, "fp8_paged_mqa_logits": fp8_paged_mqa_logits,
         "is_xe2_arch": is_xe2_arch, "top_k_per_row_prefill": top_k_per_row_prefill,
         "top_k_per_row_decode": top_k_per_row_decode}
# The ops the adapters call, by torch op path (used by the signature drift test).
CALLED = ("_xpu_C::deepseek_qnorm_rope_kv_insert", "_xpu_C::fp8_paged_mqa_logits", "_C::top_k_per_row_prefill")


def install(monkeypatch, request, missing=()):
    """Register the ops (CPU kernels) and fake extension modules; ``missing``
    leaves ops out (an older vllm-xpu-kernels). The libraries are destroyed at teardown."""
    libs = []
    for namespace, schemas in SCHEMAS.items():
        lib = torch.library.Library(namespace, "FRAGMENT")
        for name, schema in schemas.items():
            if name in missing:
                continue
            lib.define(schema)
            lib.impl(name, IMPLS[name], "CompositeExplicitAutograd" if name == "is_xe2_arch" else "CPU")
        libs.append(lib)
    request.addfinalizer(lambda: [lib._destroy() for lib in libs])
    root = types.ModuleType("vllm_xpu_kernels")
    for sub in ("_xpu_C", "_C"):
        mod = types.ModuleType(f"vllm_xpu_kernels.{sub}")
        setattr(root, sub, mod)
        monkeypatch.setitem(sys.modules, f"vllm_xpu_kernels.{sub}", mod)
    monkeypatch.setitem(sys.modules, "vllm_xpu_kernels", root)
