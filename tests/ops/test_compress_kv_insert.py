"""compress_kv_insert's own tests. Its error inputs are declared in its spec (test_errors.py), its
layouts and aliases generated (test_strides.py).

compress_kv_insert against the model's own formulation of the compressor: the whole sequence
pooled at once (windows of ``ratio`` tokens, for ratio 4 overlapped with the previous window
through the first half of the projections), RMSNorm, RoPE at each window's first position. The
op sees the same tokens split over several calls (prefill chunks, then decode steps), with the
state cache carrying the incomplete windows; the compressed entries must agree.

The Triton paths the tunables choose (one program per window, or channel-group pooling programs
then the entry writes; several tokens per state-copy program), each against the reference:
conformance cases with token counts that do not divide by the copy's tokens per program."""
import pytest
import torch
from helpers import BACKENDS, model_entries, needs_triton

import dsv4ops
from dsv4ops import formats
from dsv4ops.conformance import build_inputs, run_case
from dsv4ops.conformance.cases import make_case
from dsv4ops.formats import COMPRESSED_LAYOUTS
from dsv4ops.ops import OPS
from dsv4ops.sampling import cos_sin_cache

# --- chunked calls against the model's formulation -------------------------------------------

def decoded(cache, layout, block_size, n):
    if layout == "fp8_ds_mla":
        return formats.read_kv(cache, layout, block_size, torch.arange(n))
    return formats.unpack_index_keys(cache).reshape(-1, formats.INDEX_DIM)[:n]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("layout,ratio,length,cuts", [
    ("fp8_ds_mla", 4, 41, (10, 11, 23, 24, 25, 26)),
    ("index_fp8", 4, 30, (3, 4, 17)),
    ("fp8_ds_mla", 128, 300, (100, 128, 200, 255, 256, 257)),
])
def test_chunked_calls_match_the_model(backend, layout, ratio, length, cuts):
    gen = torch.Generator().manual_seed(1)
    c, D = formats.window_overlap(ratio), COMPRESSED_LAYOUTS[layout].head_dim
    kv = torch.randn(length, c * D, generator=gen)
    score = 2 * torch.randn(length, c * D, generator=gen)
    ape = 0.5 * torch.randn(ratio, c * D, generator=gen)
    weight = 1 + 0.1 * torch.randn(D, generator=gen)
    cs = cos_sin_cache(length + ratio)
    sbs, bs = 4, 8
    n_pages = -(-length // sbs)
    state_table = torch.randperm(n_pages + 3, generator=gen)[:n_pages].to(torch.int32)[None]
    state = torch.full((n_pages + 3, sbs, 2 * c * D), float("nan"))
    entries = length // ratio
    nb = -(-entries // bs)
    if layout == "fp8_ds_mla":
        cache = formats.allocate_kv_cache(nb, bs, layout)
    else:
        cache = torch.zeros(nb, bs, 1, formats.INDEX_TOKEN_BYTES, dtype=torch.uint8)
    bounds = (0, *cuts, length)
    for a, b in zip(bounds[:-1], bounds[1:]):
        pos = torch.arange(a, b)
        slots = torch.where((pos + 1) % ratio == 0, pos // ratio, -1)
        dsv4ops.compress_kv_insert(kv[a:b], score[a:b], pos, ape, weight, cs, state,
                                   state_table[0, pos // sbs].long() * sbs + pos % sbs, state_table,
                                   torch.zeros(b - a, dtype=torch.int32), cache, slots, layout=layout, ratio=ratio,
                                   block_size=bs, backend=backend)
    want = model_entries(kv, score, ape, weight, 1e-6, ratio, cs)
    if layout == "fp8_ds_mla":
        expect = formats.allocate_kv_cache(nb, bs, layout)
        formats.write_kv(expect, layout, bs, torch.arange(entries), want)
    else:
        keys = torch.zeros(nb * bs, formats.INDEX_DIM)
        keys[:entries] = want
        expect = formats.pack_index_keys(keys.view(nb, bs, -1), "ue8m0")
    got, ref = decoded(cache, layout, bs, entries), decoded(expect, layout, bs, entries)
    assert torch.isfinite(got).all()
    torch.testing.assert_close(got, ref, rtol=2 ** -3, atol=1e-6)    # within one fp8 step
    assert (got == ref).float().mean() > 0.99                          # and almost all bit-equal


# --- the Triton paths ------------------------------------------------------------------------

PATH_CASES = [dict(layout="fp8_ds_mla", ratio=4, reqs=((0, 9), (5, 1), (7, 1), (30, 6)), block_size=4, pad=1, dp_pad=1),
         dict(layout="index_fp8", ratio=4, reqs=((2, 7), (11, 2), (0, 4)), block_size=8, skip_slot=True, pad=1),
         dict(layout="fp8_ds_mla", ratio=128, reqs=((100, 30), (127, 2), (0, 3)), block_size=2, pad=1, decode=3)]


@needs_triton
@pytest.mark.parametrize("tunables", [
    "compress_channels_c4=32,compress_chunk=4,compress_save_elems=4096",
    "compress_channels_c4=128,compress_channels_c128=512,compress_save_elems=512",
    "compress_channels_c128=16,compress_chunk=64,compress_pool_warps=2,compress_pool_tokens=1",
    "compress_channels_c4=64,compress_pool_tokens=4,compress_tokens=8",
    "compress_tokens=4,compress_channels_c128=1024"])
@pytest.mark.parametrize("params", PATH_CASES, ids=lambda p: f"{p['layout']}-C{p['ratio']}")
def test_compress_paths_match_the_reference(env, tunables, params):
    env(DSV4OPS_TRITON_TUNING=tunables)
    result = run_case(make_case("compress_kv_insert", **params), "triton", "cpu", seed=5)
    assert result.status == "pass", f"{result.message}\nrerun: {result.reproducer()}"


# Contract decision (docs/ops.md): what this input produces, or that it raises.
@pytest.mark.parametrize("backend", ["reference", "triton"])
def test_compress_slots_of_tokens_that_complete_no_entry_are_not_read(backend):
    """§9: slot_mapping is read only for tokens that complete an entry; any value elsewhere (here far
    out of range) is accepted and writes nothing, while an out-of-range slot for a completing
    token is an InputError."""
    kw = build_inputs("compress_kv_insert", "cpu", torch.Generator().manual_seed(11), layout="fp8_ds_mla", ratio=4, reqs=((0, 9), (5, 6)),
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


# Contract decision (docs/ops.md): what this input produces, or that it raises.
@pytest.mark.parametrize("backend", ["reference", "triton"])
def test_compress_nan_stays_in_the_entries_whose_window_reads_it(backend):
    """§9: a NaN in a token's kv or score is copied into its state row exactly; only the entries
    whose window pools that token are unspecified, every other written byte is as without it."""
    kw = build_inputs("compress_kv_insert", "cpu", torch.Generator().manual_seed(11), layout="fp8_ds_mla", ratio=4, reqs=((0, 16),), block_size=4)
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
