"""int64 addressing: caches over 2**31 bytes, touched only in their last pages (vLLM PR 41834 found
int32 overflow in exactly these kernels). The results are judged by the conformance rules against
the reference run on a copy of those last pages. Needs a GPU with a few GB free."""
import pytest
import torch

import dsv4ops
from dsv4ops import formats
from dsv4ops.conformance import compare
from dsv4ops.conformance.inputs import cos_sin_cache

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA/ROCm GPU")
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
        verdict = compare.qnorm_rope_kv_insert(None, dict(kw, q=q, kv_cache=tail_ref), q_ref,
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
        verdict = compare.sparse_mla_decode(None, dict(args, q=q_ref), ref, {}, got)
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
    verdict = compare.paged_mqa_logits(None, ref_kwargs, ref, {}, got)
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
    verdict = compare.mqa_logits(None, ref_kwargs, ref, {}, got)
    assert verdict.ok, verdict.message
