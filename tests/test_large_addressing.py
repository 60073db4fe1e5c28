"""int64 addressing: caches over 2**31 bytes, touched only in their last pages (vLLM PR 41834 found
int32 overflow in exactly these kernels). Needs a GPU with a few GB free."""
import pytest
import torch

import dsv4ops
from dsv4ops import formats
from dsv4ops.conformance.inputs import cos_sin_cache

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA/ROCm GPU")
GPU_BACKENDS = [b.name for b in dsv4ops.backends() if b.available and b.name not in ("reference",)]


def _far_slots(num_blocks, block_size, n, device):
    """n distinct slots in the last pages of the cache (byte offsets beyond 2**31)."""
    first = (num_blocks - 4) * block_size
    return (first + torch.randperm(4 * block_size, device=device)[:n]).to(torch.int64)


@pytest.mark.parametrize("backend", GPU_BACKENDS)
def test_decode_and_insert_beyond_2gb(backend):
    dev = torch.device("cuda")
    bs = 64
    num_blocks = 2**31 // formats.ds_mla_page_bytes(bs) + 64
    cache = formats.allocate_kv_cache(num_blocks, bs, "fp8_ds_mla", dev)
    assert cache.numel() > 2**31
    T, H = 8, 64
    gen = torch.Generator(device=dev).manual_seed(0)
    q = torch.randn(T, H, 512, device=dev, generator=gen).to(torch.bfloat16)
    kv = (torch.randn(T, 512, device=dev, generator=gen) * 0.3).to(torch.bfloat16)
    cs = cos_sin_cache(64).to(dev)
    pos = torch.arange(T, device=dev)
    slots = _far_slots(num_blocks, bs, T, dev)
    kw = dict(layout="fp8_ds_mla", block_size=bs)
    decision = dsv4ops.explain("qnorm_rope_kv_insert", q.clone(), kv, pos, cs, cache, slots, **kw, backend=backend)
    inserter = backend if decision.selected else "reference"
    dsv4ops.qnorm_rope_kv_insert(q.clone(), kv, pos, cs, cache, slots, **kw, backend=inserter)
    ref_cache = torch.zeros(8, formats.ds_mla_page_bytes(bs), dtype=torch.uint8, device=dev)
    local = slots - (num_blocks - 8) * bs
    dsv4ops.reference.qnorm_rope_kv_insert(q.clone(), kv, pos, cs, ref_cache, local, **kw)
    assert torch.equal(cache[-8:, :bs * 576].view(-1, 576)[:, :448], ref_cache[:, :bs * 576].view(-1, 576)[:, :448])

    indices = slots.to(torch.int32).view(1, T).expand(T, T).contiguous()
    indices = torch.cat([indices, torch.full((T, 64 - T), -1, dtype=torch.int32, device=dev)], 1)
    args = dict(layout="fp8_ds_mla", block_size=bs, softmax_scale=512 ** -0.5)
    if not dsv4ops.explain("sparse_mla_decode", q, cache, indices, **args, backend=backend).selected:
        pytest.skip(f"{backend} does not decode these inputs")
    out, lse = dsv4ops.sparse_mla_decode(q, cache, indices, **args, backend=backend)
    local_idx = torch.where(indices >= 0, indices - (num_blocks - 8) * bs, -1).to(torch.int32)
    ref_out, ref_lse = dsv4ops.reference.sparse_mla_decode(q, ref_cache, local_idx, **args)
    torch.testing.assert_close(out.float(), ref_out.float(), atol=1e-3, rtol=2.01 / 128)
    torch.testing.assert_close(lse, ref_lse, atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("backend", GPU_BACKENDS)
def test_paged_logits_beyond_2gb(backend):
    dev = torch.device("cuda")
    bs = 64
    num_blocks = 2**31 // (bs * formats.INDEX_TOKEN_BYTES) + 64
    cache = torch.zeros(num_blocks, bs, 1, formats.INDEX_TOKEN_BYTES, dtype=torch.uint8, device=dev)
    assert cache.numel() > 2**31
    B, ctx = 2, 256
    keys = torch.randn(8, bs, 128, device=dev)
    cache[-8:] = formats.pack_index_keys(keys)
    table = (num_blocks - 8 + torch.arange(8, device=dev, dtype=torch.int32)).view(B, 4)
    q = (torch.randn(B, 1, 64, 128, device=dev) * 2).to(torch.float8_e4m3fn)
    w = torch.randn(B, 64, device=dev)
    lens = torch.full((B, 1), ctx, dtype=torch.int32, device=dev)
    if not dsv4ops.explain("paged_mqa_logits", q, cache, w, lens, table, ctx, backend=backend).selected:
        pytest.skip(f"{backend} does not serve these inputs")
    got = dsv4ops.paged_mqa_logits(q, cache, w, lens, table, ctx, backend=backend)
    ref = dsv4ops.reference.paged_mqa_logits(q, cache[-8:].contiguous(), w, lens, table - (num_blocks - 8), ctx)
    torch.testing.assert_close(got, ref, atol=1e-2, rtol=1e-3)
