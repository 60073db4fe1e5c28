"""Contract decisions of docs/ops.md that users asked about, one test each: what an input produces,
or that it raises (checked for the reference and the Triton backend)."""
import pytest
import torch

import dsv4ops
from dsv4ops.conformance import build_inputs
from dsv4ops.ops import OPS

BACKENDS = ["reference", "triton"]
G = lambda: torch.Generator().manual_seed(11)


@pytest.mark.parametrize("backend", BACKENDS)
def test_mqa_logits_scales_of_uncovered_keys_are_not_read(backend):
    """§11: k_scale must be finite and > 0 on the keys some row's [ks, ke) covers; the others (the
    builder makes them NaN) are never read, so 0 or -1 there is fine and changes nothing."""
    kw = build_inputs("mqa_logits", "cpu", G(), T=6, S=40, H=8, ranges="random", clean=True)
    uncovered = kw["k_scale"].isnan()
    assert uncovered.any()
    want = dsv4ops.mqa_logits(**kw, backend="reference")
    zeroed = dict(kw, k_scale=torch.where(uncovered, -1.0, kw["k_scale"]))
    got = dsv4ops.mqa_logits(**zeroed, backend=backend)
    assert OPS["mqa_logits"].spec.conformance.compare({}, kw, want, zeroed, got).ok
    covered = int((~uncovered).nonzero()[0])
    with pytest.raises(dsv4ops.InputError, match="'k_scale'.*covers.*finite and > 0"):
        dsv4ops.mqa_logits(**dict(zeroed, k_scale=torch.where(torch.arange(40) == covered, 0.0, zeroed["k_scale"])),
                           backend=backend)


@pytest.mark.parametrize("backend", BACKENDS)
def test_compress_slots_of_tokens_that_complete_no_entry_are_not_read(backend):
    """§9: slot_mapping is read only for tokens that complete an entry; any value elsewhere (here far
    out of range) is accepted and writes nothing, while an out-of-range slot for a completing
    token is an InputError."""
    kw = build_inputs("compress_kv_insert", "cpu", G(), layout="fp8_ds_mla", ratio=4, reqs=((0, 9), (5, 6)),
                      block_size=4)
    n = kw["state_slot_mapping"].shape[0]
    completes = (kw["state_slot_mapping"] >= 0) & ((kw["positions"][:n] + 1) % 4 == 0)
    ref = {k: v.clone() if isinstance(v, torch.Tensor) else v for k, v in kw.items()}
    dsv4ops.compress_kv_insert(**ref, backend="reference")
    wild = {k: v.clone() if isinstance(v, torch.Tensor) else v for k, v in kw.items()}
    wild["slot_mapping"] = torch.where(completes, wild["slot_mapping"], 1 << 40)
    dsv4ops.compress_kv_insert(**wild, backend=backend)
    assert OPS["compress_kv_insert"].spec.conformance.compare({}, ref, None, wild, None).ok
    bad = {k: v.clone() if isinstance(v, torch.Tensor) else v for k, v in kw.items()}
    bad["slot_mapping"] = torch.where(completes, 1 << 40, bad["slot_mapping"])
    with pytest.raises(dsv4ops.InputError, match="'slot_mapping'.*complete"):
        dsv4ops.compress_kv_insert(**bad, backend=backend)


@pytest.mark.parametrize("backend", BACKENDS)
def test_inv_rope_nan_stays_in_its_block(backend):
    """§8: a NaN in o makes only the 1x128 blocks it reaches (after the inverse RoPE, which mixes a
    head's last 64 values in pairs) unspecified; every other block is quantized as without it."""
    kw = build_inputs("inv_rope_fp8_quant", "cpu", G(), T=3, H=4, n_groups=2)
    clean_a, clean_s = dsv4ops.inv_rope_fp8_quant(**kw, backend="reference")
    o = kw["o"].clone()
    o[1, 2, 470] = float("nan")                   # token 1, head 2, a RoPE value: block 3 of that head
    a, scale = dsv4ops.inv_rope_fp8_quant(**dict(kw, o=o), backend=backend)
    blocks = a.view(torch.uint8).view(3, 2, -1, 128)
    want = clean_a.view(torch.uint8).view(3, 2, -1, 128)
    hit = torch.zeros(3, 2, blocks.shape[2], dtype=torch.bool)
    hit[1, 1, (2 % 2) * 4 + 3] = True             # group 1 holds heads 2-3: head 2's fourth block
    assert torch.equal(blocks[~hit], want[~hit])
    assert torch.equal(scale.view(3, 2, -1)[~hit], clean_s.view(3, 2, -1)[~hit])


@pytest.mark.parametrize("backend", BACKENDS)
def test_compress_nan_stays_in_the_entries_whose_window_reads_it(backend):
    """§9: a NaN in a token's kv or score is copied into its state row exactly; only the entries
    whose window pools that token are unspecified, every other written byte is as without it."""
    kw = build_inputs("compress_kv_insert", "cpu", G(), layout="fp8_ds_mla", ratio=4, reqs=((0, 16),), block_size=4)
    clean = {k: v.clone() if isinstance(v, torch.Tensor) else v for k, v in kw.items()}
    dsv4ops.compress_kv_insert(**clean, backend="reference")
    dirty = {k: v.clone() if isinstance(v, torch.Tensor) else v for k, v in kw.items()}
    p0 = 5
    row = int((dirty["positions"] == p0).nonzero()[0])
    dirty["kv"][row, 7] = float("nan")
    dsv4ops.compress_kv_insert(**dirty, backend=backend)
    state_slot = int(dirty["state_slot_mapping"][row])
    got_state, want_state = dirty["state_cache"].view(-1, dirty["state_cache"].shape[-1]), \
        clean["state_cache"].view(-1, clean["state_cache"].shape[-1])
    assert got_state[state_slot, 7].isnan()
    others = torch.arange(got_state.shape[0]) != state_slot
    assert torch.equal(got_state[others].view(torch.int32), want_state[others].view(torch.int32))
    # C4 windows pool 8 positions: entries completed at positions 7 and 11 read position 5
    n = dirty["positions"].shape[0]
    completes = (dirty["positions"][:n] + 1) % 4 == 0
    reads = completes & (dirty["positions"][:n] >= p0) & (dirty["positions"][:n] - 8 < p0)
    unspecified = dirty["slot_mapping"][reads]
    cache_got, cache_want = dirty["kv_cache"], clean["kv_cache"]
    owned = torch.zeros_like(cache_got, dtype=torch.bool)
    data, scales = dsv4ops.formats.ds_mla_views(owned, 4)
    data[unspecified // 4, unspecified % 4] = True
    scales[unspecified // 4, unspecified % 4] = True
    assert torch.equal(cache_got[~owned], cache_want[~owned])
