"""The Triton V4.1 record codecs (backends/triton/common.py) against the reference codecs
(dsv4ops/quant.py): writer bytes identical, reader values identical, on split and inline pages with
an unpadded page pitch, through both fp8 paths (TRITON_INTERPRET=1)."""
import os

import pytest
import torch

import triton
import triton.language as tl

from dsv4ops import formats, quant
from dsv4ops.backends.triton import common as c
from dsv4ops.backends.triton.interpreter import patch_triton_interpreter

pytestmark = pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1", reason="needs TRITON_INTERPRET=1")

V41 = ("mxfp8_v41", "mxfp8_v41_inline", "nvfp4_v41", "nvfp4_v41_inline")
BLOCK_SIZE = 4


@triton.jit
def write(x_ptr, slot_ptr, cache_ptr, page_pitch, R: tl.constexpr, NVFP4: tl.constexpr,
          BLOCK_SIZE: tl.constexpr, TOKEN_BYTES: tl.constexpr, DATA_BYTES: tl.constexpr,
          INLINE: tl.constexpr, SOFT: tl.constexpr):
    rows = tl.arange(0, R)
    x = tl.load(x_ptr + rows[:, None] * 512 + tl.arange(0, 512)[None, :])
    slot = tl.load(slot_ptr + rows)
    data, scale = c.v41_record_offsets(slot % BLOCK_SIZE, BLOCK_SIZE, TOKEN_BYTES, DATA_BYTES, INLINE)
    page = (slot // BLOCK_SIZE).to(tl.int64) * page_pitch
    if NVFP4:
        values, scales = c.nvfp4_encode(x, R, SOFT)
    else:
        values, scales = c.mxfp8_encode(x, R, SOFT)
    tl.store(cache_ptr + (page + data)[:, None] + tl.arange(0, DATA_BYTES)[None, :], values)
    tl.store(cache_ptr + (page + scale)[:, None] + tl.arange(0, TOKEN_BYTES - DATA_BYTES)[None, :], scales)

@triton.jit
def read(cache_ptr, slot_ptr, out_ptr, page_pitch, R: tl.constexpr, NVFP4: tl.constexpr,
         BLOCK_SIZE: tl.constexpr, TOKEN_BYTES: tl.constexpr, DATA_BYTES: tl.constexpr,
         INLINE: tl.constexpr, SOFT: tl.constexpr):
    rows = tl.arange(0, R)
    slot = tl.load(slot_ptr + rows)
    data, scale = c.v41_record_offsets(slot % BLOCK_SIZE, BLOCK_SIZE, TOKEN_BYTES, DATA_BYTES, INLINE)
    page = (slot // BLOCK_SIZE).to(tl.int64) * page_pitch
    values = tl.load(cache_ptr + (page + data)[:, None] + tl.arange(0, DATA_BYTES)[None, :])
    scales = tl.load(cache_ptr + (page + scale)[:, None] + tl.arange(0, TOKEN_BYTES - DATA_BYTES)[None, :])
    if NVFP4:
        y = c.nvfp4_decode(values, scales, R, SOFT)
    else:
        y = c.mxfp8_decode(values, scales, R, SOFT)
    tl.store(out_ptr + rows[:, None] * 512 + tl.arange(0, 512)[None, :], y)



def _rows(seed: int) -> torch.Tensor:
    """8 rows of 512 with corner tiles: saturating, tiny amax, NaN, inf, -0, all-zero."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(8, 512, generator=g) * torch.logspace(-3, 3, 8).unsqueeze(1)
    x[1, :32] *= 1e6
    x[2, 32:64] *= 1e-12
    x[3, 64:80] = float("nan")
    x[3, 100] = float("nan")
    x[4, 200] = float("inf")
    x[4, 300] = float("-inf")
    x[5, :64] = -0.0
    x[5, 64:96] = 0.0
    x[6, 128:160] = torch.tensor([-0.1, 0.2, -0.24, 0.26] * 8) * 2.0 ** -9
    return x


@pytest.mark.parametrize("soft", [False, True], ids=["hw", "soft"])
@pytest.mark.parametrize("name", V41)
def test_record_codec_matches_reference(name, soft, request):
    if soft:
        request.getfixturevalue("no_fp8_types")
    assert patch_triton_interpreter()
    layout = formats.LAYOUTS[name]
    nvfp4 = layout.kind == formats.Layout.NVFP4
    x = _rows(seed=len(name) + soft)
    slots = torch.randperm(3 * BLOCK_SIZE, generator=torch.Generator().manual_seed(7))[:8].to(torch.int32)
    page_bytes = layout.min_page_bytes(BLOCK_SIZE) + 8                # unpadded, odd pitch
    cache = torch.full((3, page_bytes), 0xA5, dtype=torch.uint8)
    meta = dict(R=8, NVFP4=nvfp4, BLOCK_SIZE=BLOCK_SIZE, TOKEN_BYTES=layout.token_bytes,
                DATA_BYTES=layout.data_bytes, INLINE=layout.inline, SOFT=soft)
    write[(1,)](x, slots, cache, cache.stride(0), **meta)

    encode, decode = (quant.encode_nvfp4, quant.decode_nvfp4) if nvfp4 else (quant.encode_mxfp8, quant.decode_mxfp8)
    want_values, want_scales = encode(x)
    data, scales = formats.record_views(cache, layout, BLOCK_SIZE)
    page, slot = (slots // BLOCK_SIZE).long(), (slots % BLOCK_SIZE).long()
    assert torch.equal(data[page, slot], want_values)
    assert torch.equal(scales[page, slot], want_scales)
    untouched = torch.ones(3 * BLOCK_SIZE, dtype=torch.bool)
    untouched[slots.long()] = False
    assert bool((data.reshape(-1, layout.data_bytes)[untouched] == 0xA5).all())
    assert bool((cache[:, layout.min_page_bytes(BLOCK_SIZE):] == 0xA5).all())

    out = torch.full((8, 512), 12345.0)
    read[(1,)](cache, slots, out, cache.stride(0), **meta)
    torch.testing.assert_close(out, decode(want_values, want_scales), rtol=0, atol=0, equal_nan=True)


@triton.jit
def read_index_mxfp4(cache_ptr, page_ptr, slot_ptr, out_ptr, n, block_size, page_stride, R: tl.constexpr):
    rows = tl.arange(0, R)
    live = rows < n
    page = tl.load(page_ptr + rows, mask=live, other=0).to(tl.int64)
    slot = tl.load(slot_ptr + rows, mask=live, other=0)
    y = c.index_mxfp4_keys(cache_ptr, page, slot, live, block_size, page_stride, R)
    tl.store(out_ptr + rows[:, None] * 128 + tl.arange(0, 128)[None, :], y)


def test_index_mxfp4_key_tile_matches_reference():
    """``index_mxfp4_keys`` on a cache whose pages sit 8 bytes apart past their records (the pitch is an
    argument): the values of ``formats.unpack_index_keys`` (NaN and inf blocks, -0, tiny and huge
    scales), masked rows 0."""
    assert patch_triton_interpreter()
    bs = 4
    picked = [4, 5, 8, 12, 16, 17, 18, 20, 25, 0, 1, 2]      # saturating, tiny, NaN, inf, -inf, -0, ties
    keys = _rows(seed=3).reshape(32, 128)[picked].reshape(3, bs, 128)
    packed = formats.pack_index_keys(keys, layout="index_mxfp4")
    pitch = bs * 68 + 8
    cache = torch.full((3, pitch), 0xA5, dtype=torch.uint8)
    cache[:, :bs * 68] = packed.reshape(3, bs * 68)
    want = formats.unpack_index_keys(packed)
    page = torch.tensor([2, 0, 1, 2, 0, 1, 1, 0, 2, 2, 0], dtype=torch.int32)
    slot = torch.tensor([3, 0, 2, 1, 3, 0, 1, 2, 0, 2, 1], dtype=torch.int32)
    out = torch.full((16, 128), 12345.0)
    read_index_mxfp4[(1,)](cache, page, slot, out, 11, bs, pitch, R=16)
    torch.testing.assert_close(out[:11], want[page.long(), slot.long()], rtol=0, atol=0, equal_nan=True)
    assert bool((out[11:] == 0).all())
    assert bool(want.isnan().any()) and bool((want == 0).any())           # NaN / inf blocks and zeros are there
