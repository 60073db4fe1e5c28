"""DeepSeek-V4.1 records (docs/ops.md §6): the codecs on byte patterns worked out by hand from the
rules, the split / inline page layouts, page widths and the cache converter."""
import pytest
import torch

from dsv4ops import formats
from dsv4ops.quant import (
    decode_mxfp4, decode_mxfp8, decode_nvfp4, e2m1_code, encode_mxfp4, encode_mxfp8, encode_nvfp4,
)

V41 = ("mxfp8_v41", "mxfp8_v41_inline", "nvfp4_v41", "nvfp4_v41_inline")


def blocks(*values_per_block, width):
    """A [1, 512] row: block i filled from values_per_block[i] (a list, zero-padded), the rest 0."""
    row = torch.zeros(1, 512)
    for i, vals in enumerate(values_per_block):
        row[0, i * width: i * width + len(vals)] = torch.tensor(vals)
    return row


def test_mxfp8_scale_and_values_by_hand():
    # block 0: amax 1 -> ceil(log2(1/448)) = -8 -> byte 119, 1.0 / 2^-8 = 256 = e4m3 0x78
    # block 1: amax 448 -> e = 0 -> byte 127; 1.0625 ties 1.0 / 1.125 -> even 1.0 (0x38); 1.1875 -> 1.25 (0x3A)
    # block 2: all zero -> quotient floored at 1e-4 -> e = -13 -> byte 114; -0.0 keeps its sign (0x80)
    # block 3: amax 1e-6 -> floored -> e = -13: 1e-6 * 2^13 = 4.19 subnormal steps of 2^-9 -> 0x04
    row = blocks([1.0], [448.0, 1.0625, 1.1875], [0.0, -0.0], [1e-6], width=32)
    values, scales = encode_mxfp8(row)
    assert scales[0, :5].tolist() == [119, 127, 114, 114, 114]
    assert values[0, 0] == 0x78 and values[0, 32:35].tolist() == [0x7E, 0x38, 0x3A]
    assert values[0, 64:66].tolist() == [0x00, 0x80] and values[0, 96] == 0x04
    assert decode_mxfp8(values, scales)[0, 96] == 4 * 2.0 ** -9 * 2.0 ** -13


def test_mxfp8_nan_and_inf_blocks():
    row = blocks([1.0, float("nan")], [float("inf")], [2.0], width=32)
    values, scales = encode_mxfp8(row)
    assert scales[0, :3].tolist() == [255, 255, 120]          # UE8M0 NaN for the NaN and inf blocks
    back = decode_mxfp8(values, scales)
    assert back[0, :64].isnan().all() and back[0, 64] == 2.0


def test_e2m1_rne_ties_saturation_and_signed_zero():
    x = torch.tensor([0.25, 0.26, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, 5.1, 7.0, 1e9, -0.0, -0.1, -6.0])
    assert e2m1_code(x).tolist() == [0, 1, 2, 2, 4, 4, 6, 6, 7, 7, 7, 8, 8, 15]


def test_nvfp4_scale_and_values_by_hand():
    # block 0: amax 6 -> scale 1.0 (e4m3 0x38); 6 -> 7, -6 -> 0xF: byte 0 = 0x7 | 0xF << 4
    # block 1: zero -> scale clamped to 2^-9 (0x01), values 0
    # block 2: amax 6 * 2^-8 -> scale 2^-8, an e4m3 subnormal (0x02)
    # block 3: amax 5376 -> 896 clamped to 448 (0x7E); 5376 / 448 = 12 saturates to 6
    # block 4: amax 6.375 -> 1.0625 ties 1.0 / 1.125 -> 1.0 (0x38); 6.375 saturates to 6
    row = blocks([6.0, -6.0, 0.75, -0.1], [], [6 * 2.0 ** -8], [5376.0], [6.375], width=16)
    packed, scales = encode_nvfp4(row)
    assert scales[0, :5].tolist() == [0x38, 0x01, 0x02, 0x7E, 0x38]
    assert packed[0, :2].tolist() == [0xF7, 0x82]
    assert packed[0, 8:16].eq(0).all() and packed[0, 16] == 0x07 and packed[0, 24] == 0x07 and packed[0, 32] == 0x07
    back = decode_nvfp4(packed, scales)
    assert back[0, :4].tolist() == [6.0, -6.0, 1.0, -0.0] and back[0, 48] == 2688.0


def test_nvfp4_nan_block():
    row = blocks([1.0], [2.0, float("nan")], width=16)
    packed, scales = encode_nvfp4(row)
    assert scales[0, 1] == 0x7F and packed[0, 8:16].eq(0).all()
    back = decode_nvfp4(packed, scales)
    assert back[0, 16:32].isnan().all() and not back[0, :16].isnan().any()


@pytest.mark.parametrize("layout", V41)
def test_v41_codecs_round_trip(layout, gen):
    rows = torch.randn(64, 512, generator=gen) * torch.rand(64, 1, generator=gen) * 10
    back = formats.unpack_kv(formats.pack_kv(rows, layout, 16), layout, 16)
    assert torch.allclose(back, rows, rtol=0.25, atol=rows.abs().max().item() / 24)


@pytest.mark.parametrize("layout", V41)
def test_v41_page_layout_bytes(layout, gen):
    lay = formats.Layout.of(layout)
    rows = torch.randn(1, 512, generator=gen)
    data, scales = formats.encode_records(rows, lay)
    for page_bytes in (None, lay.min_page_bytes(4), lay.min_page_bytes(4) + 3):
        cache = formats.allocate_kv_cache(2, 4, layout, page_bytes=page_bytes)
        assert cache.shape[1] == (page_bytes or -(-4 * lay.token_bytes // lay.page_align) * lay.page_align)
        formats.write_kv(cache, layout, 4, torch.tensor([6]), rows)           # page 1, token 2
        if lay.inline:
            start = 2 * lay.token_bytes
            assert torch.equal(cache[1, start:start + lay.data_bytes], data[0])
            assert torch.equal(cache[1, start + lay.data_bytes:start + lay.token_bytes], scales[0])
        else:
            assert torch.equal(cache[1, 2 * lay.data_bytes:3 * lay.data_bytes], data[0])
            s0 = 4 * lay.data_bytes + 2 * lay.scale_bytes
            assert torch.equal(cache[1, s0:s0 + lay.scale_bytes], scales[0])
        assert int((cache != 0).sum()) <= lay.token_bytes and cache[0].eq(0).all()
    with pytest.raises(ValueError, match="page_bytes"):
        formats.allocate_kv_cache(1, 4, layout, page_bytes=lay.min_page_bytes(4) - 1)


def test_convert_split_inline_lossless(gen):
    rows = torch.randn(32, 512, generator=gen)
    for kind in ("mxfp8_v41", "nvfp4_v41"):
        split = formats.pack_kv(rows, kind, 16)
        inline = formats.convert_kv_cache(split, kind, kind + "_inline", 16,
                                          page_bytes=formats.Layout.of(kind).min_page_bytes(16))
        assert torch.equal(inline, formats.pack_kv(rows, kind + "_inline", 16, page_bytes=inline.shape[1]))
        assert torch.equal(formats.convert_kv_cache(inline, kind + "_inline", kind, 16), split)


def test_convert_ds_mla_to_mxfp8(gen):
    rows = torch.randn(32, 512, generator=gen)
    v4 = formats.pack_kv(rows, "fp8_ds_mla", 16)
    v41 = formats.convert_kv_cache(v4, "fp8_ds_mla", "mxfp8_v41", 16)
    a, b = formats.unpack_kv(v4, "fp8_ds_mla", 16), formats.unpack_kv(v41, "mxfp8_v41", 16)
    assert torch.equal(a[:, :448], b[:, :448])                  # NoPE: exact (amax / 448 >= 1e-4 here)
    assert torch.allclose(a[:, 448:], b[:, 448:], rtol=2 ** -4, atol=0)   # RoPE bf16 -> e4m3: lossy
    back = formats.convert_kv_cache(v41, "mxfp8_v41", "fp8_ds_mla", 16)
    assert torch.equal(formats.unpack_kv(back, "fp8_ds_mla", 16)[:, 448:], b[:, 448:])   # e4m3 -> bf16 exact
    with pytest.raises(ValueError, match="no conversion"):
        formats.convert_kv_cache(v41, "mxfp8_v41", "nvfp4_v41", 16)


def test_mxfp4_index_key_by_hand():
    # block 0: amax 6 -> e = ceil(log2(1)) = 0 -> byte 127; 6 -> code 7, -0.75 ties to even 1.0 -> 0xA,
    #          -0.1 rounds to 0 keeping its sign -> 0x8, 2.5 ties down to 2 -> 0x4
    # block 1: amax 12 -> e = 1 -> byte 128; 12 / 2 = 6 -> code 7
    # block 2: all zero -> quotient floored at 2^-126 -> byte 1
    # block 3: NaN -> byte 255, nibbles 0
    row = torch.zeros(1, 128)
    row[0, :4] = torch.tensor([6.0, -0.75, -0.1, 2.5])
    row[0, 32:34] = torch.tensor([12.0, 1.0])
    row[0, 96:98] = torch.tensor([1.0, float("nan")])
    packed, scales = encode_mxfp4(row)
    assert scales[0].tolist() == [127, 128, 1, 255]
    assert packed[0, :2].tolist() == [0x7 | 0xA << 4, 0x8 | 0x4 << 4]
    assert packed[0, 16] == 0x7 | 0x1 << 4              # 12 / 2 = 6 -> 7; 1 / 2 = 0.5 -> 1
    assert bool((packed[0, 48:] == 0).all())
    back = decode_mxfp4(packed, scales)
    assert back[0, :4].tolist() == [6.0, -1.0, -0.0, 2.0] and back[0, 32:34].tolist() == [12.0, 1.0]
    assert back[0, 96:].isnan().all() and bool((back[0, 64:96] == 0).all())


def test_index_key_layouts_pack_and_unpack(gen):
    keys = torch.randn(3, 8, 128, generator=gen) * torch.rand(3, 8, 1, generator=gen)
    cache = formats.pack_index_keys(keys, layout="index_mxfp4")
    assert cache.shape == (3, 8, 1, 68) and formats.index_layout(cache).name == "index_mxfp4"
    values, scales = formats.index_key_views(cache)
    flat = cache.reshape(3, 8 * 68)
    assert torch.equal(flat[:, :8 * 64].reshape(3, 8, 64), values)      # value rows first, then scale rows
    assert torch.equal(flat[:, 8 * 64:].reshape(3, 8, 4), scales)
    ref_packed, ref_scales = encode_mxfp4(keys.reshape(24, 128))
    assert torch.equal(values.reshape(24, 64), ref_packed) and torch.equal(scales.reshape(24, 4), ref_scales)
    back = formats.unpack_index_keys(cache)
    assert ((back - keys).abs() <= keys.abs().reshape(3, 8, 4, 32).amax(-1, keepdim=True).expand(3, 8, 4, 32)
            .reshape(3, 8, 128) / 6 * 2 + 1e-30).all()                # at most a scale step per value
    fp8 = formats.pack_index_keys(keys)
    assert formats.index_layout(fp8).name == "index_fp8" and formats.unpack_index_keys(fp8).shape == keys.shape
    with pytest.raises(ValueError, match="68"):
        formats.index_layout(torch.zeros(2, 4, 1, 100, dtype=torch.uint8))
