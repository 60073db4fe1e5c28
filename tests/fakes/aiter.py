"""Fakes of the released AITER entry points that backends/aiter calls, written from AITER's source
(ROCm/aiter tag v0.1.20, commit fc2e5d57fb5b8ad8e7e23f7103071dde798ea618; identical in v0.1.20.post1
de07f3885ee5 and main e4048607a535). The parameter lists are copied from the release as signatures
only; the bodies are our own plain-PyTorch models of what the kernels compute:

- ``aiter/ops/triton/attention/pa_decode_sparse.py::pa_decode_sparse`` (blob c6fafb181e67), with the
  gfx950 Gluon driver ``_pa_decode_sparse_gfx950_gluon`` (kernel
  ``aiter/ops/triton/_gluon_kernels/gfx950/attention/pa_decode_sparse.py``, blob 54d526ca51b1) and
  the Triton kernel for other arches (``_triton_kernels/attention/pa_decode_sparse.py``, blob
  6c5b27a8e584, modelled at KV_SPLITS == 1, the case that seeds the running max with the sink).
- ``aiter/ops/triton/attention/pa_prefill_sparse.py::pa_prefill_sparse`` (commit 2038b2df470d, the
  v0.1.20 signature), gfx950 branch only (below).
- ``aiter/ops/triton/attention/fp8_mqa_logits.py::fp8_mqa_logits`` (blob 8d33e29e4789), below.
- ``aiter/ops/topk.py::top_k_per_row_{prefill,decode}`` (blob db701f913d41) over
  ``csrc/kernels/topk_per_row_kernels.cu`` (blob dd4bc62594e6): absolute column ids
  (``i + rowStart``), -1 past the row's count, ``stride1`` ignored.

The arch (AITER's import-time ``arch_info.get_arch()``) is read from the simulated platform.
``install(monkeypatch, version=...)`` can also install the signatures of older releases (v0.1.17
decode without ``extra_*``, v0.1.12 top-k without ``k``) to test the version messages.
"""
import sys
import types

import torch

from dsv4ops.platform import current_simulation

LOG2E = 1.4426950408889634
NOPE, ROPE = 448, 64


def _arch():
    sim = current_simulation()
    return sim.arch if sim is not None else "gfx942"


# ------------------------------------------------------------------------------------------------
# pa_decode_sparse

def _rows_packed(cache, slots):
    """gfx950 Gluon addressing of the 3-D uint8 [nb, BLOCK, 584] cache: page p = slot // BLOCK,
    pos = slot % BLOCK, NoPE fp8 (OCP e4m3) at p*cs0 + pos*576, bf16 RoPE at p*cs0 + pos*576 + 448,
    UE8M0 bytes at p*cs0 + BLOCK*576 + pos*8 (scale 2^(e-127), one per 64 dims); cs0 = stride(0)."""
    nb, block, width = cache.shape
    assert width == 584 and cache.dtype == torch.uint8 and cache.stride(1) == 584 and cache.stride(2) == 1
    cs0 = cache.stride(0)
    flat = cache.as_strided((nb * cs0,), (1,))                 # the bytes behind the view
    page, pos = slots // block, slots % block
    data = page * cs0 + pos * 576
    nope = flat[data[..., None] + torch.arange(NOPE)].view(torch.float8_e4m3fn).float()
    rope = flat[data[..., None] + NOPE + torch.arange(2 * ROPE)].contiguous().view(torch.bfloat16).float()
    e = flat[(page * cs0 + block * 576 + pos * 8)[..., None] + torch.arange(7)].long()
    scale = torch.ldexp(torch.ones_like(e, dtype=torch.float32), (e - 127).int())
    nope = (nope.view(*slots.shape, 7, 64) * scale[..., None]).reshape(*slots.shape, NOPE)
    return torch.cat([nope, rope], -1)


def _rows_block(cache, slots):
    """bf16 block cache [nb, BLOCK, 512]: page*stride(0) + pos*512."""
    nb, block, _ = cache.shape
    return cache[slots // block, slots % block].float()


def _rows_pool(pool, scales, slots):
    """2-D page-size-1 pool [pages, D]: bf16 / fp16, or fp8 with fp32 [pages, D // 64] scales."""
    if scales is None:
        return pool[slots].float()
    fp8 = pool.view(torch.float8_e4m3fn) if pool.dtype == torch.uint8 else pool
    vals = fp8[slots].float()
    return (vals.view(*slots.shape, -1, 64) * scales[slots][..., None]).reshape(vals.shape)


def _segment(rows_of, indices, indptr, N):
    """CSR -> keys [N, n, D] and valid [N, n]; -1 entries skipped (has_invalid)."""
    counts = (indptr[1:] - indptr[:-1]).tolist()
    n = max(counts + [1])
    idx = torch.full((N, n), -1, dtype=torch.int64)
    for t in range(N):
        idx[t, : counts[t]] = indices[indptr[t]: indptr[t + 1]]
    valid = idx >= 0
    keys = rows_of(torch.where(valid, idx, 0))
    return torch.where(valid[..., None], keys, 0.0), valid


def _gluon_gfx950(q, cache, cache_scales, indices, indptr, scale, attn_sink, extra_cache, extra_indices,
                  extra_indptr):
    """Natural-exp online softmax; with a sink l_final = l*alpha + exp(sink - m_final); out = acc / l
    (no guard: a row with no valid key and no sink gives 0/0 = NaN)."""
    N, H, D = q.shape
    if cache.ndim == 2:
        keys, valid = _segment(lambda s: _rows_pool(cache, cache_scales, s), indices, indptr, N)
    else:
        packed = cache.dtype == torch.uint8
        keys, valid = _segment(lambda s: (_rows_packed if packed else _rows_block)(cache, s), indices, indptr, N)
        if extra_cache is not None and extra_indices is not None and extra_indptr is not None:
            x_packed = extra_cache.dtype == torch.uint8
            k2, v2 = _segment(lambda s: (_rows_packed if x_packed else _rows_block)(extra_cache, s),
                              extra_indices, extra_indptr, N)
            keys, valid = torch.cat([keys, k2], 1), torch.cat([valid, v2], 1)
    s = torch.einsum("thd,tkd->thk", q.float(), keys) * scale
    s = s.masked_fill(~valid[:, None, :], float("-inf"))
    m = s.amax(-1, keepdim=True)
    p = torch.where(valid[:, None, :], torch.exp(s - m), 0.0)
    l = p.sum(-1, keepdim=True)
    if attn_sink is not None:
        l = l + torch.exp(attn_sink.float()[None, :, None] - m)
    out = torch.einsum("thk,tkd->thd", p, keys) / l
    return out.to(torch.bfloat16)


def _triton_single_split(q, pool, kv_scales, indices, indptr, attn_sink, scale):
    """q pre-scaled by softmax_scale*log2e and rounded to q's dtype before the dot; m_i = sink*log2e,
    l_i = exp2(sink*log2e - m_i) (NaN for an infinite sink, which then reaches l through l_i * alpha);
    alpha = where(m_new == -inf, 1, exp2(m_i - m_new)); out = where(l > 0, acc / max(l, 1e-30), 0)."""
    N, H, D = q.shape
    keys, valid = _segment(lambda s: _rows_pool(pool, kv_scales, s), indices, indptr, N)
    qs = (q.float() * (scale * LOG2E)).to(q.dtype).float()
    s2 = torch.einsum("thd,tkd->thk", qs, keys).masked_fill(~valid[:, None, :], float("-inf"))
    sink2 = attn_sink.float()[None, :, None] * LOG2E
    m_i, l_i = sink2, torch.exp2(sink2 - sink2)                    # NaN for an infinite sink
    m = torch.maximum(m_i, s2.amax(-1, keepdim=True))              # one tile: m_new, then alpha
    alpha = torch.where(m == float("-inf"), 1.0, torch.exp2(m_i - m))
    p = torch.where(valid[:, None, :], torch.exp2(s2 - m), 0.0)
    l = l_i * alpha + p.sum(-1, keepdim=True)
    acc = torch.einsum("thk,tkd->thd", p, keys)
    return torch.where(l > 0, acc / torch.clamp(l, min=1e-30), 0.0).to(q.dtype)


def pa_decode_sparse(
    q: torch.Tensor,
    unified_kv: torch.Tensor,
    kv_indices: torch.Tensor,
    kv_indptr: torch.Tensor,
    attn_sink: torch.Tensor,
    softmax_scale: float,
    kv_scales: torch.Tensor | None = None,
    block_h: int | None = None,
    kv_splits: int | None = None,
    has_invalid: bool | None = True,
    skip_reduce: bool | None = False,
    USE_EXP2: bool | None = None,
    *,
    extra_cache: torch.Tensor | None = None,
    extra_indices: torch.Tensor | None = None,
    extra_indptr: torch.Tensor | None = None,
) -> torch.Tensor:
    if q.dtype not in (torch.bfloat16, torch.float16):
        raise RuntimeError(f"pa_decode_sparse expects fp16/bf16 q, got {q.dtype}")
    assert has_invalid and not skip_reduce and isinstance(softmax_scale, float)
    if _arch() == "gfx950" and block_h is None and q.dtype == torch.bfloat16:
        if unified_kv.ndim == 3:
            ok = kv_scales is None and unified_kv.dtype in (torch.uint8, q.dtype)
        else:
            fp8 = unified_kv.dtype in (torch.float8_e4m3fn, torch.float8_e4m3fnuz, torch.uint8)
            ok = (kv_scales is not None and fp8) or (kv_scales is None and unified_kv.dtype == q.dtype)
        if ok:
            assert q.ndim == 3 and kv_indices.dim() == 1 and kv_indptr.numel() == q.shape[0] + 1
            assert unified_kv.dtype != torch.float8_e4m3fnuz, "fnuz pool: not modelled by this fake"
            if unified_kv.ndim == 2:
                assert kv_scales.dtype == torch.float32 and kv_scales.shape == (unified_kv.shape[0], 512 // 64)
                extra_cache = extra_indices = extra_indptr = None          # has_extra = False
            return _gluon_gfx950(q, unified_kv, kv_scales, kv_indices.int(), kv_indptr.int(), softmax_scale,
                                 attn_sink, extra_cache, extra_indices, extra_indptr)
    assert extra_cache is None and extra_indices is None and extra_indptr is None, \
        "extra_cache/extra_indices/extra_indptr are gfx950 packed-only"
    if kv_scales is not None:
        assert unified_kv.dtype == torch.float8_e4m3fnuz
    elif unified_kv.dtype != q.dtype:
        raise RuntimeError(f"unified_kv dtype mismatch: kv={unified_kv.dtype}, q={q.dtype}")
    assert unified_kv.ndim == 2 and unified_kv.is_contiguous(), "Triton path: [total_pages, D] pool"
    assert kv_indices.dtype == torch.int32 and kv_indices.is_contiguous()
    assert kv_indptr.dtype == torch.int32 and kv_indptr.is_contiguous()
    assert isinstance(attn_sink, torch.Tensor), "the Triton kernel loads attn_sink_ptr unconditionally"
    return _triton_single_split(q, unified_kv, kv_scales, kv_indices, kv_indptr, attn_sink, softmax_scale)


def pa_decode_sparse_v0_1_17(
    q: torch.Tensor,
    unified_kv: torch.Tensor,
    kv_indices: torch.Tensor,
    kv_indptr: torch.Tensor,
    attn_sink: torch.Tensor,
    softmax_scale: float,
    kv_scales: torch.Tensor | None = None,
    block_h: int | None = None,
    kv_splits: int | None = None,
    has_invalid: bool | None = True,
    skip_reduce: bool | None = False,
    USE_EXP2: bool | None = None,
) -> torch.Tensor:
    """v0.1.17 (32214c295ea2): no extra_* and no gfx950 DSV4 driver."""
    raise AssertionError("the adapter must not call a pre-0.1.20 pa_decode_sparse on gfx950")


# ------------------------------------------------------------------------------------------------
# top-k

def _select(logits, starts, ends, indices, k):
    """One row per r: the k largest of logits[r, start:end] as absolute columns (i + rowStart);
    slots [row_len, k) = -1; a negative row_len gives all -1 (csrc/kernels/topk_per_row_kernels.cu
    lines 404, 2227). Reads row r at r * stride0 with unit column stride (stride1 is ignored)."""
    rows = logits.as_strided((logits.shape[0], logits.shape[1]), (logits.stride(0), 1))
    indices.fill_(-1)
    for r in range(rows.shape[0]):
        s, e = int(starts[r]), int(ends[r])
        n = min(k, max(0, e - s))
        if n:
            indices[r, :n] = (torch.topk(rows[r, s:e], n).indices + s).to(torch.int32)


def top_k_per_row_prefill(
    logits: torch.Tensor,
    rowStarts: torch.Tensor,
    rowEnds: torch.Tensor,
    indices: torch.Tensor,
    values: torch.Tensor | None,
    numRows: int,
    stride0: int,
    stride1: int,
    k: int = 2048,
    stable: bool = False,
) -> None:
    assert logits.dtype == torch.float32 and indices.dtype == torch.int32 and tuple(indices.shape) == (numRows, k)
    assert rowStarts.dtype == rowEnds.dtype == torch.int32 and stride0 == logits.stride(0)
    assert values is None or values.shape == indices.shape
    _select(logits, rowStarts, rowEnds, indices, k)


def top_k_per_row_decode(
    logits: torch.Tensor,
    next_n: int,
    seqLens: torch.Tensor,
    indices: torch.Tensor,
    numRows: int,
    stride0: int,
    stride1: int,
    k: int = 2048,
    stable: bool = False,
) -> None:
    """Row r = b*next_n + j: row_len = seqLens[r // next_n] - next_n + (r % next_n) + 1, rowStart 0."""
    assert seqLens.dim() == 1 and seqLens.dtype == torch.int32 and tuple(indices.shape) == (numRows, k)
    assert stride0 == logits.stride(0)
    r = torch.arange(numRows)
    ends = seqLens.long()[r // next_n] - next_n + r % next_n + 1
    _select(logits, torch.zeros_like(ends), ends, indices, k)


def top_k_per_row_decode_v0_1_12(logits: torch.Tensor, next_n: int, seqLens: torch.Tensor, indices: torch.Tensor,
                                 numRows: int, stride0: int, stride1: int) -> None:
    raise AssertionError("k is fixed at 2048 before v0.1.15")


def top_k_per_row_prefill_v0_1_12(logits: torch.Tensor, rowStarts: torch.Tensor, rowEnds: torch.Tensor,
                                  indices: torch.Tensor, values: torch.Tensor | None, numRows: int, stride0: int,
                                  stride1: int) -> None:
    raise AssertionError("k is fixed at 2048 before v0.1.15")


# ------------------------------------------------------------------------------------------------
# pa_prefill_sparse (v0.1.20 signature; ROCm/aiter commit 2038b2df470d70a734ce12f697a1e7ac8a184cad,
# aiter/ops/triton/attention/pa_prefill_sparse.py)

def pa_prefill_sparse(
    q: torch.Tensor,
    unified_kv: torch.Tensor,
    kv_indices_prefix: torch.Tensor,
    kv_indptr_prefix: torch.Tensor,
    kv: torch.Tensor | None,
    kv_indices_extend: torch.Tensor | None,
    kv_indptr_extend: torch.Tensor | None,
    attn_sink: torch.Tensor | None,
    softmax_scale: float,
    has_invalid: bool | None = None,
) -> torch.Tensor:
    """gfx950 dispatches to ``mla_gluon`` over the single prefix pool (an extend source raises
    NotImplementedError there); modelled like the gfx950 decode driver: natural-exp softmax with the
    sink in the denominator, -1 entries skipped, no guard for rows without a valid entry (NaN).
    Other arches: gfx1250's two-pool Gluon kernel and the Triton fallback (whose ``attn_sink or
    torch.empty(1)`` raises for a sink of more than one head) are not modelled."""
    arch = _arch()
    extend = [n for n, t in (("kv", kv), ("kv_indices_extend", kv_indices_extend),
                             ("kv_indptr_extend", kv_indptr_extend)) if t is not None]
    if arch != "gfx950":
        raise AssertionError(f"pa_prefill_sparse on {arch} is not modelled")
    if extend:
        raise NotImplementedError(f"pa_prefill_sparse got an extend KV source ({', '.join(extend)})")
    T, H, D = q.shape
    assert q.dtype in (torch.bfloat16, torch.float16) and unified_kv.dtype == q.dtype, (q.dtype, unified_kv.dtype)
    assert unified_kv.dim() == 2 and unified_kv.shape[1] == D, unified_kv.shape
    assert H in (64, 128) or H <= 16, f"mla_gluon serves 64 or 128 heads, or at most 16 (got {H})"
    assert kv_indptr_prefix.shape == (T + 1,)
    assert attn_sink is None or (attn_sink.dtype == torch.float32 and attn_sink.shape == (H,))
    return _gluon_gfx950(q, unified_kv, None, kv_indices_prefix.to(torch.int64), kv_indptr_prefix.to(torch.int64),
                         softmax_scale, attn_sink, None, None, None)


# ------------------------------------------------------------------------------------------------
# fp8_mqa_logits (v0.1.20, commit fc2e5d57fb5b: aiter/ops/triton/attention/fp8_mqa_logits.py blob
# 8d33e29e4789, Triton kernel _triton_kernels/attention/fp8_mqa_logits.py blob de32438fb9d9;
# unchanged at main e4048607a535; ``clean_logits`` from v0.1.15)

def fp8_mqa_logits(
    Q,
    KV,
    kv_scales,
    weights,
    cu_starts,
    cu_ends,
    clean_logits=True,
):
    """gfx942: OCP Q / KV recast to FNUZ (x 0.5) with kv_scales x 4; gfx950's Gluon kernel reads the
    native (OCP) dtype. Per row: sum_h w_h relu(Q_h . KV_s * kv_scales_s) written for s in
    [max(start, 0), min(end, S_kv)); the rest -inf (clean_logits) or left as allocated. Returns the
    [S, S_kv] view of an [S, round_up(S_kv, 256)] allocation."""
    seq_len, num_heads, head_size = Q.shape
    seq_len_kv = KV.shape[0]
    assert num_heads & (num_heads - 1) == 0, "num q. heads should be power of 2."
    assert head_size & (head_size - 1) == 0, "head size should be power of 2."
    assert num_heads >= 16, "tl.dot needs 16 rows (the Triton kernel puts the heads there)"
    assert kv_scales.dtype == torch.float32 and kv_scales.shape == (seq_len_kv,)
    assert weights.shape == (seq_len, num_heads) and cu_starts.dtype == cu_ends.dtype == torch.int32
    assert cu_starts.stride(0) == cu_ends.stride(0) == 1, "the kernel reads cu_start_ptr + row_id"
    fnuz = torch.float8_e4m3fnuz
    if _arch() == "gfx942":
        scale_mul = 1.0
        if Q.dtype != fnuz:
            Q, scale_mul = (Q.float() * 0.5).to(fnuz), scale_mul * 2
        if KV.dtype != fnuz:
            KV, scale_mul = (KV.float() * 0.5).to(fnuz), scale_mul * 2
        kv_scales = kv_scales * scale_mul
    else:
        assert Q.dtype == KV.dtype == torch.float8_e4m3fn, "the gfx950 Gluon kernel reads OCP fp8"
    aligned = (seq_len_kv + 255) // 256 * 256
    logits = torch.full((seq_len, aligned), float("-inf") if clean_logits else 123.0)[:, :seq_len_kv]
    scores = torch.einsum("shd,nd->shn", Q.float(), KV.float()) * kv_scales
    values = torch.einsum("sh,shn->sn", weights.float(), scores.clamp_min(0))
    cols = torch.arange(seq_len_kv)
    window = (cols >= cu_starts.long().clamp_min(0)[:, None]) & (cols < cu_ends.long().clamp(max=seq_len_kv)[:, None])
    logits[window] = values[window]
    return logits


def fp8_mqa_logits_v0_1_12(Q, KV, kv_scales, weights, cu_starts, cu_ends):
    raise AssertionError("no clean_logits before v0.1.15")


# The functions the adapters call, by the vendor module path (used by the signature drift test).
CALLED = {
    "aiter.ops.triton.attention.pa_decode_sparse:pa_decode_sparse": pa_decode_sparse,
    "aiter.ops.topk:top_k_per_row_decode": top_k_per_row_decode,
    "aiter.ops.topk:top_k_per_row_prefill": top_k_per_row_prefill,
    "aiter.ops.triton.attention.pa_prefill_sparse:pa_prefill_sparse": pa_prefill_sparse,
    "aiter.ops.triton.attention.fp8_mqa_logits:fp8_mqa_logits": fp8_mqa_logits,
}


def install(monkeypatch, version="0.1.20", wrap=None):
    """Put fake ``aiter`` modules in sys.modules. ``version`` "0.1.17" installs the pre-extra_cache
    decode, "0.1.12" also the top-k without ``k`` and fp8_mqa_logits without ``clean_logits``. ``wrap(path, fn)`` may wrap each called function."""
    names = ["aiter", "aiter.ops", "aiter.ops.triton", "aiter.ops.triton.attention",
             "aiter.ops.triton.attention.pa_decode_sparse", "aiter.ops.topk", "aiter.ops.triton.attention.fp8_mqa_logits",
             "aiter.ops.triton.attention.pa_prefill_sparse"]
    if version < "0.1.20":                       # pa_prefill_sparse off gfx1250 from 0.1.20
        names.pop()
    modules = {name: types.ModuleType(name) for name in names}
    modules["aiter"].__version__ = version
    fns = dict(CALLED)
    if version < "0.1.20":
        fns["aiter.ops.triton.attention.pa_decode_sparse:pa_decode_sparse"] = pa_decode_sparse_v0_1_17
        del fns["aiter.ops.triton.attention.pa_prefill_sparse:pa_prefill_sparse"]
    if version < "0.1.15":
        fns["aiter.ops.topk:top_k_per_row_decode"] = top_k_per_row_decode_v0_1_12
        fns["aiter.ops.topk:top_k_per_row_prefill"] = top_k_per_row_prefill_v0_1_12
        fns["aiter.ops.triton.attention.fp8_mqa_logits:fp8_mqa_logits"] = fp8_mqa_logits_v0_1_12
    for path, fn in fns.items():
        module, _, name = path.partition(":")
        setattr(modules[module], name, wrap(path, fn) if wrap else fn)
    for name, module in modules.items():
        parent, _, child = name.rpartition(".")
        if parent:
            setattr(modules[parent], child, module)
        monkeypatch.setitem(sys.modules, name, module)
