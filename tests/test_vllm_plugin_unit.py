"""The vLLM plugin's parts that need no vLLM: page windows over strided cache views, the switch,
the counters and the no-silent-fallback rule."""
import subprocess
import sys

import pytest
import torch

import dsv4ops
from dsv4ops import formats, settings
from dsv4ops.errors import ConfigError
from dsv4ops.integrations import vllm as plugin
from dsv4ops.integrations.vllm import calls, routing
from dsv4ops.integrations.vllm.mapping import dense_compressed_local, fp8_weight_blocks, window_local
from dsv4ops.integrations.vllm.paging import PageWindow, request_keys, table_pages


def _strided_cache(num_blocks, block_size, record, pitch, gen):
    """A vLLM-style per-layer view: pages of ``pitch`` bytes in a shared buffer."""
    buffer = torch.randint(0, 256, (num_blocks * pitch,), dtype=torch.uint8, generator=gen)
    return buffer, buffer.as_strided((num_blocks, block_size, record), (pitch, record, 1))


def test_insert_through_a_page_window_matches_a_contiguous_cache():
    gen = torch.Generator().manual_seed(1)
    block, pitch = 4, 4 * 584 + 300
    buffer, view = _strided_cache(6, block, 584, pitch, gen)
    before = buffer.clone()
    T, H = 5, 3
    q = torch.randn(T, H, 512, generator=gen).bfloat16()
    kv = torch.randn(T, 512, generator=gen).bfloat16()
    positions = torch.randint(0, 64, (T,), generator=gen)
    cos_sin = torch.randn(64, 64, generator=gen)
    slots = torch.tensor([21, 2, -1, 9, 23])
    # the expected bytes: the same insert into a contiguous dsv4ops cache holding the view's pages
    full = torch.zeros(6, formats.ds_mla_page_bytes(block), dtype=torch.uint8)
    full[:, :block * 584] = view.reshape(6, -1)
    q_ref = dsv4ops.qnorm_rope_kv_insert(q.clone(), kv, positions, cos_sin, full, slots, layout="fp8_ds_mla",
                                         block_size=block, backend="reference")
    window = PageWindow.for_slots(view, (formats.ds_mla_page_bytes(block),), block, slots)
    assert window.pages.tolist() == [0, 2, 5]
    q_got = dsv4ops.qnorm_rope_kv_insert(q.clone(), kv, positions, cos_sin, window.cache, window.slots(slots, block),
                                         layout="fp8_ds_mla", block_size=block, backend="reference")
    window.write_back()
    assert torch.equal(q_got, q_ref)
    assert torch.equal(view.reshape(6, -1), full[:, :block * 584])
    gaps = torch.ones(6, pitch, dtype=torch.bool)
    gaps[:, :block * 584] = False
    assert torch.equal(buffer.view(6, pitch)[gaps], before.view(6, pitch)[gaps])   # other layers' bytes kept
    assert not torch.equal(buffer, before)


def test_block_table_renumbered_onto_the_window():
    gen = torch.Generator().manual_seed(2)
    _, view = _strided_cache(9, 2, 132, 2 * 132 + 8, gen)
    table = torch.tensor([[7, 3, 0], [5, 8, 8]], dtype=torch.int32)
    pages = table_pages(table, torch.tensor([2, 1]), 9)
    window = PageWindow(view, pages, (2, 1, 132))
    assert window.pages.tolist() == [3, 5, 7]
    renumbered = window.block_table(table)
    assert renumbered[0, :2].tolist() == [2, 0] and renumbered[1, 0].item() == 1
    assert torch.equal(window.cache[0].reshape(-1), view[3].reshape(-1))


def test_switch_is_off_by_default_and_register_does_nothing(monkeypatch, caplog):
    monkeypatch.delenv("DSV4OPS_VLLM", raising=False)
    settings.reload()
    assert not plugin.enabled()
    caplog.set_level("DEBUG", logger="vllm.dsv4ops")
    plugin.register()
    assert "vllm" not in sys.modules or not plugin._installed
    assert "off" in caplog.text
    assert "off" in plugin.status()


def test_native_names_are_checked(monkeypatch):
    monkeypatch.setenv("DSV4OPS_VLLM_NATIVE", "fp8_einsum,not_an_op")
    settings.reload()
    try:
        with pytest.raises(ConfigError, match="not_an_op"):
            routing.native_ops()
        monkeypatch.setenv("DSV4OPS_VLLM_NATIVE", "fp8_einsum")
        settings.reload()
        assert not routing.routed("o_proj") and routing.routed("attention")
    finally:
        monkeypatch.delenv("DSV4OPS_VLLM_NATIVE")
        settings.reload()


def test_counters_count_routed_calls():
    routing.reset_routed_calls()
    gen = torch.Generator().manual_seed(3)
    logits = torch.randn(2, 40, generator=gen)
    routing.call("indexer_topk", logits, 4, row_starts=torch.zeros(2, dtype=torch.int32),
                 row_ends=torch.full((2,), 40, dtype=torch.int32))
    assert plugin.routed_calls() == {"indexer_topk": 1}
    plugin.reset_routed_calls()
    assert plugin.routed_calls() == {}


def test_every_step_is_explained_at_load_for_the_tiny_v4():
    for ratio in (0, 4, 128):
        cfg = calls.LayerConfig(heads=16, groups=4, o_lora_rank=128, ratio=max(ratio, 1), window=128,
                                index_heads=64, index_topk=512, device="cpu")
        for step in calls.steps_of(cfg):
            routing.require(step, ("unit", cfg), lambda step=step: calls.BUILDERS[step](cfg))


def test_unservable_configuration_fails_load_naming_the_op(monkeypatch):
    monkeypatch.setenv("DSV4OPS_BACKEND", "flashmla")          # no FlashMLA on this machine
    settings.reload()
    try:
        cfg = calls.LayerConfig(heads=16, groups=4, o_lora_rank=128, ratio=1, window=128, index_heads=0,
                                index_topk=0, device="cpu")
        with pytest.raises(ConfigError, match=r"(?s)qnorm_rope_kv_insert\(bfloat16\[1, 16, 512\].*DSV4OPS_VLLM_NATIVE"):
            routing.require("insert", ("unservable", cfg), lambda: calls.insert(cfg))
        monkeypatch.setenv("DSV4OPS_VLLM_NATIVE", "qnorm_rope_kv_insert")
        settings.reload()
        routing.require("insert", ("unservable", cfg), lambda: calls.insert(cfg))      # opted out: no error
    finally:
        monkeypatch.delenv("DSV4OPS_BACKEND")
        monkeypatch.delenv("DSV4OPS_VLLM_NATIVE", raising=False)
        settings.reload()


def test_import_dsv4ops_imports_no_vllm():
    """In a fresh interpreter (another test may have imported vLLM into this one)."""
    code = ("import sys, dsv4ops, dsv4ops.cli, dsv4ops.integrations.vllm; "
            "print(sorted(m for m in sys.modules if m == 'vllm' or m.startswith('vllm.')))")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "[]"


def test_a_window_without_live_slots_still_has_a_page():
    gen = torch.Generator().manual_seed(4)
    _, view = _strided_cache(3, 2, 584, 2 * 584 + 16, gen)
    window = PageWindow.for_slots(view, (formats.ds_mla_page_bytes(2),), 2, torch.full((2, 3), -1))
    assert window.cache.shape == (1, formats.ds_mla_page_bytes(2))
    assert window.slots(torch.full((2, 3), -1), 2).eq(-1).all()


def test_window_and_dense_selections():
    positions = torch.tensor([0, 2, 9])
    local = window_local(positions, 4)
    assert local.tolist() == [[0, -1, -1, -1], [0, 1, 2, -1], [6, 7, 8, 9]]
    dense = dense_compressed_local(torch.tensor([2, 3, 9]), 4, 3)
    assert dense.tolist() == [[-1, -1, -1], [0, -1, -1], [0, 1, -1]]


def test_wo_a_blocks_dequantize_to_the_weight():
    gen = torch.Generator().manual_seed(5)
    groups, rows, K = 2, 128, 256
    weight = (torch.randn(groups * rows, K, generator=gen) * torch.rand(groups * rows, 1, generator=gen)).bfloat16()
    b, b_scale = fp8_weight_blocks(weight, None, groups, rows)
    assert b.dtype == torch.float8_e4m3fn and b.shape == (groups, rows, K) and b_scale.shape == (groups, 1, 2)
    back = b.float() * b_scale.repeat_interleave(128, 1).repeat_interleave(128, 2)
    ref = weight.float().view(groups, rows, K)
    assert torch.all((back - ref).abs() <= 2 ** -3 * ref.abs() + b_scale.max() * 2 ** -9)
    # an FP8 checkpoint's weight and block scales are taken as they are
    b2, s2 = fp8_weight_blocks(b.reshape(groups * rows, K), b_scale.reshape(groups, 2), groups, rows)
    assert torch.equal(b2.view(torch.uint8), b.view(torch.uint8)) and torch.equal(s2, b_scale)


def test_request_keys_gathers_each_requests_prefix_in_order():
    gen = torch.Generator().manual_seed(6)
    keys = torch.randn(4, 2, 128, generator=gen)
    cache = formats.pack_index_keys(keys, scale_fmt="ue8m0")
    table = torch.tensor([[3, 0, 1], [2, 1, 0]], dtype=torch.int32)
    k, k_scale, offsets = request_keys(cache, table, torch.tensor([3, 1]))
    assert offsets.tolist() == [0, 3]
    dequantized = k.float() * k_scale[:, None]
    expected = torch.stack([keys[3, 0], keys[3, 1], keys[0, 0], keys[2, 0]])
    assert torch.allclose(dequantized, formats.unpack_index_keys(cache)[[3, 3, 0, 2], [0, 1, 0, 0]])
    assert torch.allclose(dequantized, expected, rtol=2 ** -3, atol=k_scale.max().item())
