"""int64 addressing: caches over 2**31 bytes, touched only in their last pages (vLLM PR 41834 found
int32 overflow in exactly these kernels). The results are judged by the conformance rules against
the reference run on a copy of those last pages. Needs a GPU with a few GB free."""
import pytest
import torch

import dsv4ops
from dsv4ops import formats
from dsv4ops.ops import OPS
from dsv4ops.sampling import cos_sin_cache

pytestmark = pytest.mark.gpu
GPU_BACKENDS = [b.name for b in dsv4ops.backends() if b.available and b.name != "reference"]
TAIL = 8    # pages at the end of the cache that the test touches


def _serves(op, backend, *args, **kwargs):
    return dsv4ops.explain(op, *args, backend=backend, **kwargs).selected is not None


@pytest.mark.parametrize("backend", GPU_BACKENDS)
def test_insert_and_decode_beyond_2gb(backend):
    dev, bs, T, H = torch.device("cuda"), 64, 8, 64
    num_blocks = 2**31 // formats.ds_mla_page_bytes(bs) + 64
    cache = formats.allocate_kv_cache(num_blocks, bs, "fp8_ds_mla", dev)
    assert cache.numel() > 2**31
    gen = torch.Generator(device=dev).manual_seed(0)
    q = torch.randn(T, H, 512, device=dev, generator=gen).to(torch.bfloat16)
    kv = (torch.randn(T, 512, device=dev, generator=gen) * 0.3).to(torch.bfloat16)
    cs, pos = cos_sin_cache(64).to(dev), torch.arange(T, device=dev)
    base = (num_blocks - TAIL) * bs
    local = (TAIL // 2) * bs + torch.randperm((TAIL // 2) * bs, device=dev)[:T]
    kw = dict(layout="fp8_ds_mla", block_size=bs)
    ran_insert = _serves("qnorm_rope_kv_insert", backend, q, kv, pos, cs, cache, local + base, **kw)
    q_got = dsv4ops.qnorm_rope_kv_insert(q.clone(), kv, pos, cs, cache, local + base, **kw,
                                         backend=backend if ran_insert else "reference")
    tail_ref = torch.zeros_like(cache[-TAIL:])
    q_ref = dsv4ops.reference.qnorm_rope_kv_insert(q.clone(), kv, pos, cs, tail_ref, local, **kw)
    if ran_insert:
        verdict = OPS["qnorm_rope_kv_insert"].spec.conformance.compare({}, dict(kw, q=q, kv_cache=tail_ref), q_ref,
                                               dict(kw, q=q, kv_cache=cache[-TAIL:]), q_got)
        assert verdict.ok, verdict.message

    idx = torch.full((T, 64), -1, dtype=torch.int32, device=dev)
    idx[:, :T] = local.to(torch.int32)
    args = dict(layout="fp8_ds_mla", block_size=bs, softmax_scale=512 ** -0.5)
    if not _serves("sparse_mla_decode", backend, q_ref, cache, idx + base, **args) and not ran_insert:
        pytest.skip(f"{backend} serves neither op here")
    if _serves("sparse_mla_decode", backend, q_ref, cache, idx + base, **args):
        far = torch.where(idx >= 0, idx + base, -1)
        got = dsv4ops.sparse_mla_decode(q_ref, cache, far, **args, backend=backend)
        ref = dsv4ops.reference.sparse_mla_decode(q_ref, tail_ref, idx, **args)
        verdict = OPS["sparse_mla_decode"].spec.conformance.compare({}, dict(args, q=q_ref), ref, {}, got)
        assert verdict.ok, verdict.message


@pytest.mark.parametrize("backend", GPU_BACKENDS)
def test_paged_logits_beyond_2gb(backend):
    dev, bs, B, ctx = torch.device("cuda"), 64, 2, 256
    num_blocks = 2**31 // (bs * formats.INDEX_TOKEN_BYTES) + 64
    cache = torch.zeros(num_blocks, bs, 1, formats.INDEX_TOKEN_BYTES, dtype=torch.uint8, device=dev)
    assert cache.numel() > 2**31
    cache[-TAIL:] = formats.pack_index_keys(torch.randn(TAIL, bs, 128, device=dev))
    table = torch.arange(TAIL, device=dev, dtype=torch.int32).view(B, TAIL // B)
    q = (torch.randn(B, 1, 64, 128, device=dev) * 2).to(torch.float8_e4m3fn)
    w = torch.randn(B, 64, device=dev)
    lens = torch.full((B, 1), ctx, dtype=torch.int32, device=dev)
    far = table + (num_blocks - TAIL)
    if not _serves("paged_mqa_logits", backend, q, cache, w, lens, far, ctx):
        pytest.skip(f"{backend} does not serve paged_mqa_logits here")
    got = dsv4ops.paged_mqa_logits(q, cache, w, lens, far, ctx, backend=backend)
    ref_kwargs = dict(q=q, kv_cache=cache[-TAIL:].contiguous(), weights=w, context_lens=lens, block_table=table,
                      max_context_len=ctx, clean=False, out=None)
    ref = dsv4ops.reference.paged_mqa_logits(**ref_kwargs)
    verdict = OPS["paged_mqa_logits"].spec.conformance.compare({}, ref_kwargs, ref, {}, got)
    assert verdict.ok, verdict.message


@pytest.mark.parametrize("backend", GPU_BACKENDS)
def test_mqa_logits_beyond_2gb(backend):
    """Keys past 2**31 bytes (s * 128) and logits past 2**31 elements (t * S + s): every row's range lies
    in the last W keys; the reference runs on those keys alone."""
    dev, H, W = torch.device("cuda"), 64, 512
    S = 2**24 + 2 * W                     # fp8 keys: 2**31 bytes + 128 KiB
    T = 2**31 // S + 2                    # fp32 logits: T * S > 2**31 elements (8.7 GB)
    gen = torch.Generator(device=dev).manual_seed(0)
    k = torch.zeros(S, 128, dtype=torch.float8_e4m3fn, device=dev)
    k[-W:] = (torch.randn(W, 128, device=dev, generator=gen) * 3).to(torch.float8_e4m3fn)
    k_scale = torch.rand(S, device=dev, generator=gen) + 0.5
    q = (torch.randn(T, H, 128, device=dev, generator=gen) * 2).to(torch.float8_e4m3fn)
    w = torch.randn(T, H, device=dev, generator=gen)
    t = torch.arange(T, device=dev)
    ks = (S - W + t % (W // 2)).to(torch.int32)
    ke = (ks + 1 + t % (W // 2)).to(torch.int32)
    if not _serves("mqa_logits", backend, q, k, k_scale, w, ks, ke):
        pytest.skip(f"{backend} does not serve mqa_logits here")
    got = dsv4ops.mqa_logits(q, k, k_scale, w, ks, ke, backend=backend)[:, -W:].contiguous()
    ref_kwargs = dict(q=q, k=k[-W:].contiguous(), k_scale=k_scale[-W:].contiguous(), weights=w, ks=ks - (S - W),
                      ke=ke - (S - W), clean=False, out=None)
    ref = dsv4ops.reference.mqa_logits(**ref_kwargs)
    verdict = OPS["mqa_logits"].spec.conformance.compare({}, ref_kwargs, ref, {}, got)
    assert verdict.ok, verdict.message


def _compress_tail(dev, backend, state_blocks, cache_blocks):
    """compress_kv_insert on one C4 request whose state pages and entries are the last pages of a
    ``state_blocks``-page state cache and a ``cache_blocks``-page fp8_ds_mla cache; judged against
    the reference run on copies of those pages alone."""
    D, ratio, sbs, bs, T = 512, 4, 4, 64, 64
    gen = torch.Generator(device=dev).manual_seed(0)
    state = torch.zeros(state_blocks, sbs, 4 * D, device=dev)
    cache = formats.allocate_kv_cache(cache_blocks, bs, "fp8_ds_mla", dev)
    kv = torch.randn(T, 2 * D, device=dev, generator=gen)
    score = torch.randn(T, 2 * D, device=dev, generator=gen)
    ape = torch.randn(ratio, 2 * D, device=dev, generator=gen) * 0.5
    weight, cs, pos = torch.ones(D, device=dev), cos_sin_cache(T).to(dev), torch.arange(T, device=dev)
    pages = T // sbs
    local_table = torch.arange(pages, dtype=torch.int32, device=dev)[None]
    local_sslots = pos // sbs * sbs + pos % sbs
    local_slots = torch.where((pos + 1) % ratio == 0, pos // ratio, -1)
    far_slots = torch.where(local_slots >= 0, local_slots + (cache_blocks - 1) * bs, -1)
    args = (kv, score, pos, ape, weight, cs)
    kw = dict(layout="fp8_ds_mla", ratio=ratio, block_size=bs)
    req = torch.zeros(T, dtype=torch.int32, device=dev)
    far = (state, local_sslots + (state_blocks - pages) * sbs, local_table + (state_blocks - pages), req,
           cache, far_slots)
    if not _serves("compress_kv_insert", backend, *args, *far, **kw):
        pytest.skip(f"{backend} does not serve compress_kv_insert here")
    dsv4ops.compress_kv_insert(*args, *far, **kw, backend=backend)
    ref_state, ref_cache = torch.zeros_like(state[-pages:]), torch.zeros_like(cache[-1:])
    ref_kwargs = dict(kw, state_cache=ref_state, state_slot_mapping=local_sslots, positions=pos,
                      slot_mapping=local_slots, kv_cache=ref_cache)
    dsv4ops.reference.compress_kv_insert(*args, ref_state, local_sslots, local_table, req, ref_cache, local_slots,
                                         **kw)
    verdict = OPS["compress_kv_insert"].spec.conformance.compare({}, ref_kwargs, None,
                                         dict(state_cache=state[-pages:], kv_cache=cache[-1:]), None)
    assert verdict.ok, verdict.message


@pytest.mark.parametrize("backend", GPU_BACKENDS)
def test_compress_beyond_2gb(backend):
    """State cache and compressed cache both over 2**31 bytes, written only in their last pages."""
    state_blocks = 2**31 // (4 * 2048 * 4) + 32
    cache_blocks = 2**31 // formats.ds_mla_page_bytes(64) + 16
    _compress_tail(torch.device("cuda"), backend, state_blocks, cache_blocks)


@pytest.mark.parametrize("backend", GPU_BACKENDS)
def test_inv_rope_beyond_2gb(backend):
    """Outputs over 2**31 bytes (T * H * 512 fp8 values); the last tokens are judged against the
    reference run on them alone."""
    dev, H, G, tail = torch.device("cuda"), 64, 8, 16
    T = 2**31 // (H * 512) + tail
    gen = torch.Generator(device=dev).manual_seed(0)
    o = (torch.randn(T, H, 512, device=dev, generator=gen) * 0.3).to(torch.bfloat16)
    pos = torch.randint(0, 4096, (T,), device=dev, generator=gen)
    cs = cos_sin_cache(4096).to(dev)
    if not _serves("inv_rope_fp8_quant", backend, o, pos, cs, n_groups=G):
        pytest.skip(f"{backend} does not serve inv_rope_fp8_quant here")
    a, a_scale = dsv4ops.inv_rope_fp8_quant(o, pos, cs, n_groups=G, backend=backend)
    assert a.numel() > 2**31
    ref = dsv4ops.reference.inv_rope_fp8_quant(o[-tail:], pos[-tail:], cs, n_groups=G)
    verdict = OPS["inv_rope_fp8_quant"].spec.conformance.compare({}, {}, ref, {}, (a[-tail:], a_scale[-tail:]))
    assert verdict.ok, verdict.message
