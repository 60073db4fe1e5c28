"""Byte layouts and round trips of dsv4ops.formats (docs/ops.md §1, §3, §5)."""
import pytest
import torch

from dsv4ops import formats
from dsv4ops.quant import ceil_log2, pack_ue8m0_scales, pow2


@pytest.mark.parametrize("block_size,data,stride", [(64, 37376, 37440), (256, 149504, 149760), (2, 1168, 1728)])
def test_ds_mla_page_sizes(block_size, data, stride):
    assert block_size * formats.DS_MLA_TOKEN_BYTES == data
    assert formats.ds_mla_page_bytes(block_size) == stride
    assert formats.allocate_kv_cache(3, block_size, "fp8_ds_mla").shape == (3, stride)


def test_ds_mla_token_bytes_and_writer_rule():
    row = torch.zeros(1, 512)
    row[0, :64] = torch.linspace(-3, 3, 64)                 # amax 3 -> e = ceil(log2(3/448)) = -7
    row[0, 64:128] = 448.0 * 2.0 ** -5                      # exact power of two: e = -5, no off-by-one
    row[0, 128:192] = 1e-6                                  # below the 1e-4 floor: vLLM rule e = ceil(log2(1e-4/448))
    row[0, 448:] = torch.arange(64) / 7
    cache = formats.allocate_kv_cache(2, 4, "fp8_ds_mla")
    cache.fill_(0xAB)
    formats.write_kv(cache, "fp8_ds_mla", 4, torch.tensor([5]), row)
    page = cache[1]
    data, scales = page[576:1152], page[4 * 576 + 8: 4 * 576 + 16]
    assert scales[0].item() == 127 - 7 and scales[1].item() == 127 - 5
    assert scales[2].item() == 127 + int(ceil_log2(torch.tensor([1e-4 / 448]))[0])
    assert scales[7].item() == 0                            # pad byte written as 0
    assert torch.equal(data[448:].view(torch.bfloat16), row[0, 448:].to(torch.bfloat16))
    assert data[:64].view(torch.float8_e4m3fn).float().mul(2.0 ** -7).allclose(row[0, :64], rtol=2 ** -3)
    untouched = torch.ones_like(page, dtype=torch.bool)
    untouched[576:1152] = False
    untouched[4 * 576 + 8: 4 * 576 + 16] = False
    assert torch.all(page[untouched] == 0xAB) and torch.all(cache[0] == 0xAB)


def test_ceil_log2_exact_at_powers_of_two():
    x = torch.tensor([2.0 ** -20, 2.0 ** -20 * 1.0000001, 1.0, 3.0, 0.75])
    assert ceil_log2(x).tolist() == [-20, -19, 0, 2, 0]
    assert pow2(torch.tensor([-127, -3, 0, 5])).tolist() == [2.0 ** -127, 0.125, 1.0, 32.0]


@pytest.mark.parametrize("layout", formats.LAYOUTS)
def test_kv_roundtrip(layout, gen):
    rows = torch.randn(32, 512, generator=gen)
    cache = formats.pack_kv(rows, layout, 16, kv_scale=0.5)
    back = formats.unpack_kv(cache, layout, 16, kv_scale=0.5)
    tol = {"bf16": 2 ** -7, "nvfp4_v41": 2 ** -2, "nvfp4_v41_inline": 2 ** -2}.get(layout, 2 ** -3)
    assert torch.allclose(back, rows, rtol=tol, atol=tol * rows.abs().amax(1, keepdim=True).max().item() / 4)
    if not formats.Layout.of(layout).is_paged_bytes:    # (a block's decoded amax may fall into a smaller scale bin)
        again = formats.pack_kv(back, layout, 16, kv_scale=0.5)
        assert torch.equal(again.view(torch.uint8), cache.view(torch.uint8))


def test_fnuz_flavour_uses_e4m3fnuz(gen):
    rows = torch.randn(4, 512, generator=gen) * 100
    cache = formats.pack_kv(rows, "fp8_ds_mla_fnuz", 4)
    data, _ = formats.ds_mla_views(cache, 4)
    values = data[0, :, :448].contiguous().view(torch.float8_e4m3fnuz).float()
    assert values.abs().max() <= 240 and values.isfinite().all()


def test_index_key_layout(gen):
    keys = torch.randn(2, 8, 128, generator=gen)
    for fmt in ("fp32", "ue8m0"):
        cache = formats.pack_index_keys(keys, fmt)
        assert cache.shape == (2, 8, 1, 132) and cache.dtype == torch.uint8
        flat = cache.reshape(2, -1)
        scales = flat[:, 8 * 128:].contiguous().view(torch.float32)         # values first, then fp32 scales
        amax = keys.abs().amax(-1)
        if fmt == "fp32":
            assert torch.allclose(scales, amax / 448)
        else:
            assert torch.all(torch.frexp(scales).mantissa == 0.5)
        values = flat[:, : 8 * 128].view(torch.float8_e4m3fn).float().view(2, 8, 128)
        assert torch.allclose(formats.unpack_index_keys(cache), values * scales[..., None])
        assert torch.allclose(formats.unpack_index_keys(cache), keys, rtol=2 ** -3, atol=amax.max().item() / 64)


def test_to_global_indices_matches_loop():
    local = torch.tensor([[0, 65, -1, 3], [130, -1, -1, -1], [1, 2, 3, 4]], dtype=torch.int32)
    block_table = torch.tensor([[7, 2, 9], [4, 0, 5]], dtype=torch.int32)
    token_to_req = torch.tensor([0, 1, 1])
    valid_tok = torch.tensor([True, True, False])
    glob, lens = formats.to_global_indices(local, block_table, token_to_req, 64, valid_tok)
    for t in range(3):
        kept = [int(block_table[token_to_req[t], l // 64]) * 64 + l % 64 for l in local[t].tolist() if l >= 0]
        assert glob[t].tolist() == kept + [-1] * (4 - len(kept))          # survivors packed left
    assert lens.tolist() == [3, 1, 0]
    assert glob.dtype == torch.int32


# vLLM's contract for compute_global_topk_indices_and_lens (its cases, block size 64): request ids
# and block indices outside the table become -1, are not counted, survivors are packed left.
# (local, token_to_req, block_table, expected global, expected lens).
GLOBAL_CASES = {
    "valid_unchanged": ([[0, 64, -1, -1]], [0], [[10, 11, 12, 13]], [[640, 704, -1, -1]], [2]),
    "req_equal_rows": ([[0, -1, -1, -1]], [1], [[10, 11, 12, 13]], [[-1, -1, -1, -1]], [0]),
    "req_above_rows": ([[0, -1, -1, -1]], [5], [[10, 11]], [[-1, -1, -1, -1]], [0]),
    "req_negative": ([[0, -1, -1, -1]], [-1], [[10, 11, 12, 13]], [[-1, -1, -1, -1]], [0]),
    "block_equal_cols": ([[128, -1, -1, -1]], [0], [[10, 11]], [[-1, -1, -1, -1]], [0]),
    "block_above_cols": ([[256, -1, -1, -1]], [0], [[10, 11]], [[-1, -1, -1, -1]], [0]),
    "negative_local": ([[-5, -1, -1, -1]], [0], [[10, 11, 12, 13]], [[-1, -1, -1, -1]], [0]),
    "row_out_of_range_no_alias": ([[0, -1, -1, -1], [0, -1, -1, -1]], [0, 1], [[10, 11, 12, 13]],
                                  [[640, -1, -1, -1], [-1, -1, -1, -1]], [1, 0]),
    "column_oob_beside_valid": ([[0, 128, -1, -1]], [0], [[10, 11]], [[640, -1, -1, -1]], [1]),
    "invalid_before_valid_packs_left": ([[128, 64, -1, -1]], [0], [[10, 11]], [[704, -1, -1, -1]], [1]),
    "padded_table_rows": ([[0, -1, -1, -1], [64, -1, -1, -1]], [0, 1], [[10, 11, 12, 13], [90, 91, 92, 93]],
                          [[640, -1, -1, -1], [91 * 64, -1, -1, -1]], [1, 1]),
    "prefill_multi_request": ([[0, -1, -1, -1], [0, -1, -1, -1], [64, -1, -1, -1]], [0, 1, 1],
                              [[10, 11], [20, 21]], [[640, -1, -1, -1], [1280, -1, -1, -1], [1344, -1, -1, -1]],
                              [1, 1, 1]),
}


@pytest.mark.parametrize("name", list(GLOBAL_CASES))
def test_to_global_indices_bounds(name):
    local, req, table, want, want_lens = GLOBAL_CASES[name]
    i32 = dict(dtype=torch.int32)
    glob, lens = formats.to_global_indices(torch.tensor(local, **i32), torch.tensor(table, **i32),
                                           torch.tensor(req, **i32), 64, torch.ones(len(req), dtype=torch.bool))
    assert glob.tolist() == want and lens.tolist() == want_lens


def test_to_global_indices_columns_are_the_logical_width():
    """A table sliced from a wider buffer: its shape[1], not its row stride, bounds the blocks."""
    table = torch.tensor([[10, 11, 12]], dtype=torch.int32)[:, :2]
    glob, lens = formats.to_global_indices(torch.tensor([[128, 64, -1, -1]], dtype=torch.int32), table,
                                           torch.tensor([0]), 64)
    assert glob.tolist() == [[704, -1, -1, -1]] and lens.tolist() == [1]


def test_to_global_indices_empty_table():
    glob, lens = formats.to_global_indices(torch.tensor([[0, 3]], dtype=torch.int32),
                                           torch.empty(0, 4, dtype=torch.int32), torch.tensor([0]), 64)
    assert glob.tolist() == [[-1, -1]] and lens.tolist() == [0]


def test_pack_ue8m0_scales():
    scales = torch.tensor([[1.0, 0.5, 2.0 ** -10, 4.0, 8.0]])
    packed = pack_ue8m0_scales(scales)
    assert packed.shape == (1, 2) and packed.dtype == torch.int32
    b = packed.view(torch.uint8).view(1, 8).tolist()[0]
    assert b[:5] == [127, 126, 117, 129, 130]
    with pytest.raises(ValueError):
        pack_ue8m0_scales(torch.tensor([0.3]))
