"""Fake of the FlashMLA entry point that backends/flashmla/prefill.py calls, written from FlashMLA's
source (deepseek-ai/FlashMLA commit 02fe0d02e83f15ae5a049cc4acc009a50553e64c:
``flash_mla/flash_mla_interface.py::flash_mla_sparse_fwd``, and FlashMLA's ``tests/ref.py::ref_sparse_attn_fwd``
at commit a123d0b0191e0da7aa1e044f8644e0989cc63220 for what it computes). The parameter list is the
one users have installed, tokenspeed-flashmla 1.0.0.post20260615 (checked against the wheel on the
H100: FlashMLA's main branch has since added an optional ``indexer_topk=0``, which the adapter does
not pass), copied as a signature only; the body is our plain-PyTorch model:

- invalid entries are ``< 0`` or ``>= s_kv``, and those at or past ``topk_length[i]``;
- lse is the natural-log log-sum-exp of the valid scores, +inf for a row with none (output 0,
  max_logits -inf); the sink scales the output by exp(lse) / (exp(lse) + exp(sink)) and changes
  neither lse nor max_logits;
- the argument checks the kernel makes: bf16 q / kv, d_qk = d_v = 512, h_q 64 or 128, one KV head,
  int32 indices ``[s_q, 1, topk]`` with topk a multiple of the kernel's index tile (64; 128 for
  h_q = 128 on SM100), fp32 sink ``[h_q]``.

tokenspeed-flashmla 1.0.0.post20260924 keeps this parameter list (its ``flash_mla_interface.py``) and
still takes a bf16 ``kv`` only: it has no prefill over the 528 / 288 B records. Its library carries
sparse prefill kernels for SM90 and SM100 (``Fwd_Sm90_Impl``, ``Fwd_Sm100_Head64_Impl``,
``Fwd_Sm100_Head128[_Small_TopK]_Impl``): the fake checks the simulated platform's arch, and the
last-dimension contiguity FlashMLA's ``csrc/api/sparse_prefill.cpp`` checks (deepseek-ai/FlashMLA 136b361a).
``flash_mla_with_kvcache`` (decode) checks its argument contract; on the V4 record it returns zeros (it
records the decode adapter's calls for the drift tests), on the V4.1 records of tokenspeed-flashmla
1.0.0.post20260924 it computes the attention.
"""
import sys
import types
from typing import Optional, Tuple

import torch

from dsv4ops import quant
from dsv4ops.platform import current_simulation

from .flashinfer import _attend


def flash_mla_sparse_fwd(
    q: torch.Tensor,
    kv: torch.Tensor,
    indices: torch.Tensor,
    sm_scale: float,
    d_v: int = 512,
    attn_sink: Optional[torch.Tensor] = None,
    topk_length: Optional[torch.Tensor] = None,
) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    s_q, h_q, d_qk = q.shape
    sim = current_simulation()
    assert sim is not None and sim.arch in ("sm90", "sm100", "sm103"), "sparse prefill kernels: SM90 / SM100 only"
    assert q.dtype == torch.bfloat16 and kv.dtype == torch.bfloat16, (q.dtype, kv.dtype)
    assert d_qk == 512 and d_v == 512 and h_q in (64, 128), (d_qk, d_v, h_q)
    assert kv.dim() == 3 and kv.shape[1:] == (1, d_qk), kv.shape
    assert indices.dtype == torch.int32 and indices.dim() == 3 and indices.shape[:2] == (s_q, 1), indices.shape
    assert all(t is None or t.stride(-1) == 1 for t in (q, kv, indices, attn_sink, topk_length)), "last dim contiguous"
    topk = indices.shape[2]
    tile = 128 if sim.arch.startswith("sm10") and h_q == 128 else 64
    assert topk % tile == 0, f"topk {topk} is not a multiple of {tile}"
    assert attn_sink is None or (attn_sink.dtype == torch.float32 and attn_sink.shape == (h_q,))
    assert topk_length is None or (topk_length.dtype == torch.int32 and topk_length.shape == (s_q,))
    idx = indices[:, 0].to(torch.int64)
    valid = (idx >= 0) & (idx < kv.shape[0])
    if topk_length is not None:
        valid &= torch.arange(topk)[None, :] < topk_length[:, None]
    keys = kv[:, 0].float()[torch.where(valid, idx, 0)]
    out, lse = _attend(q.float(), keys, valid, sm_scale, attn_sink)
    scores = torch.einsum("thd,tkd->thk", q.float(), torch.where(valid[..., None], keys, 0.0)) * sm_scale
    max_logits = scores.masked_fill(~valid[:, None, :], float("-inf")).amax(-1)
    return out.to(torch.bfloat16), max_logits, torch.where(lse == float("-inf"), float("inf"), lse)


def get_mla_metadata(*args, **kwargs):
    """1.0.0's interface: no arguments needed (kept for the old interface); an empty scheduler object."""
    return types.SimpleNamespace(), None


def flash_mla_with_kvcache(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    block_table: Optional[torch.Tensor],
    cache_seqlens: Optional[torch.Tensor],
    head_dim_v: int,
    tile_scheduler_metadata,
    num_splits: None = None,
    softmax_scale: Optional[float] = None,
    causal: bool = False,
    is_fp8_kvcache: bool = False,
    indices: Optional[torch.Tensor] = None,
    attn_sink: Optional[torch.Tensor] = None,
    extra_k_cache: Optional[torch.Tensor] = None,
    extra_indices_in_kvcache: Optional[torch.Tensor] = None,
    topk_length: Optional[torch.Tensor] = None,
    extra_topk_length: Optional[torch.Tensor] = None
) -> Tuple[torch.Tensor, torch.Tensor]:
    """The argument contract of the V4 / V4.1 sparse fp8 decode (tokenspeed-flashmla 1.0.0.post20260924's
    docstring and the checks its kernel library carries as messages). V4 values are not modelled (zeros:
    that decode runs on the H100, docs/verified.md); the V4.1 ones are: both caches' selected records
    decoded with the reference codecs from the docstring's split page, one softmax over both, the sink
    scaling the output only, lse natural-log with +inf for a row that selects nothing. The record is read from the last dimension (584 V4,
    528 V4.1, 288 V4.1 fp4 only as the extra cache of a 528 B one); the V4.1 page pitch is taken to be a
    multiple of 512 B (528) / 256 B (288), the TMA stride the kernel requires a multiple of."""
    b, s_q, h_q, d = q.shape
    assert d == 512 and head_dim_v == 512 and h_q in (64, 128) and is_fp8_kvcache and not causal, (q.shape, h_q)
    assert q.dtype == torch.bfloat16, q.dtype
    bpt = k_cache.shape[-1]
    assert bpt in (584, 528), f"Unsupported bytes_per_token {bpt} (the fp4 KV cache is only supported as extra_kv)"
    if extra_k_cache is not None:
        assert extra_k_cache.shape[-1] in (bpt, 288 if bpt == 528 else bpt), \
            "extra_kv must have the format of kv, or the V4.1 fp4 format when kv has the V4.1 format"
    for cache in (k_cache, extra_k_cache):
        if cache is None:
            continue
        row = cache.shape[-1]
        assert cache.dim() == 4 and cache.shape[2] == 1 and cache.dtype == torch.uint8, cache.shape
        assert cache.stride()[1:] == (row, row, 1), "The whole block must be contiguous for the paged KV cache"
        if row != 584:
            sim = current_simulation()
            assert sim is not None and sim.arch in ("sm100", "sm103"), "V4.1 records: SM100 kernels only"
            assert cache.stride(0) % (512 if row == 528 else 256) == 0, "block_stride_bytes % TMA_K_STRIDE == 0"
    assert num_splits is None and block_table is None and cache_seqlens is None
    for idx, cache in ((indices, k_cache), (extra_indices_in_kvcache, extra_k_cache)):
        assert (idx is None) == (cache is None) and (idx is None or (idx.dtype == torch.int32 and idx.shape[:2] == (b, s_q)))
    for lens in (topk_length, extra_topk_length):
        assert lens is None or (lens.dtype == torch.int32 and lens.shape == (b,))
    assert attn_sink is None or (attn_sink.dtype == torch.float32 and attn_sink.shape == (h_q,))
    if bpt == 584:
        return torch.zeros(b, s_q, h_q, 512, dtype=torch.bfloat16), torch.zeros(b, h_q, s_q)
    keys, valid = zip(*(_v41_keys(cache, idx, lens) for cache, idx, lens in (
        (k_cache, indices, topk_length), (extra_k_cache, extra_indices_in_kvcache, extra_topk_length))
        if cache is not None))
    q2 = q.reshape(b * s_q, h_q, d).float()
    out, lse = _attend(q2, torch.cat(keys, 1), torch.cat(valid, 1), softmax_scale, attn_sink)
    lse = torch.where(lse == float("-inf"), float("inf"), lse)
    return out.to(torch.bfloat16).reshape(b, s_q, h_q, 512), lse.reshape(b, s_q, h_q).transpose(1, 2)


def _v41_keys(cache: torch.Tensor, idx: torch.Tensor, lens: Optional[torch.Tensor]):
    """Keys ``[b * s_q, topk, 512]`` and validity of one V4.1 cache view ``[nb, bs, 1, bpt]`` read as the
    docstring's split page (``bs`` data rows, then ``bs`` scale rows); index = page * bs + offset, -1
    invalid, entries at or past the length ignored."""
    nb, bs, _, bpt = cache.shape
    data_bytes = 512 if bpt == 528 else 256
    pages = cache.reshape(nb, bs * bpt)     # one page's bytes are contiguous (checked above)
    data = pages[:, : bs * data_bytes].reshape(nb, bs, data_bytes)
    scales = pages[:, bs * data_bytes:].reshape(nb, bs, bpt - data_bytes)
    idx = idx.reshape(-1, idx.shape[-1]).to(torch.int64)
    valid = idx != -1
    if lens is not None:
        valid &= torch.arange(idx.shape[1])[None, :] < lens.repeat_interleave(idx.shape[0] // lens.shape[0])[:, None]
    slot = torch.where(valid, idx, 0)
    page, offset = slot // bs, slot % bs
    decode = quant.decode_mxfp8 if bpt == 528 else quant.decode_nvfp4
    return decode(data[page, offset], scales[page, offset]), valid


# The functions the adapters call, by the vendor module path (used by the signature drift tests).
CALLED = {"flash_mla:flash_mla_sparse_fwd": flash_mla_sparse_fwd, "flash_mla:get_mla_metadata": get_mla_metadata,
          "flash_mla:flash_mla_with_kvcache": flash_mla_with_kvcache}


def install(monkeypatch, wrap=None, sparse_fwd=None, v41=False):
    """Put the fake ``flash_mla`` module in sys.modules; ``wrap(path, fn)`` may wrap each called
    function; ``sparse_fwd`` replaces flash_mla_sparse_fwd (an older release's signature); ``v41`` adds
    the ``fused_norm_rope_attn_rope_cast`` submodule of the release that reads the V4.1 records."""
    module = types.ModuleType("flash_mla")
    if v41:
        module.fused_norm_rope_attn_rope_cast = types.ModuleType("flash_mla.fused_norm_rope_attn_rope_cast")
    for path, fn in {**CALLED, "flash_mla:flash_mla_sparse_fwd": sparse_fwd or flash_mla_sparse_fwd}.items():
        setattr(module, path.partition(":")[2], wrap(path, fn) if wrap else fn)
    monkeypatch.setitem(sys.modules, "flash_mla", module)
