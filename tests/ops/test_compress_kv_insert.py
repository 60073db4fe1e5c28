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
from dsv4ops.reference.impl.rope import rotate
from helpers import BACKENDS, model_entries, needs_triton

import dsv4ops
from dsv4ops import formats
from dsv4ops.conformance import build_inputs, run_case
from dsv4ops.conformance.cases import make_case
from dsv4ops.formats import COMPRESSED_LAYOUTS
from dsv4ops.ops import OPS
from dsv4ops.ops.compress_kv_insert import fp4_records_close
from dsv4ops.sampling import cos_sin_cache
from dsv4ops.tolerance import Collector, block_amax

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


def model_entries_v41(kv, score, weight, eps, ratio, cs):
    """DeepSeek-V4.1's compressed entries (bf16-valued fp32 [L // ratio, D]) for a whole prompt:
    pairs pooled with a two-way softmax per channel (ratio 1: each token's kv), RMSNorm, the bf16
    latent, RoPE at each group's first position, bf16."""
    n = kv.shape[0] // ratio
    kv = kv[: n * ratio].view(n, ratio, -1)
    pooled = kv[:, 0] if ratio == 1 else (kv * score[: n * ratio].view(n, ratio, -1).softmax(dim=1)).sum(dim=1)
    latent = (pooled * torch.rsqrt(pooled.square().mean(-1, keepdim=True) + eps) * weight).to(torch.bfloat16)
    rows = cs[torch.arange(n) * ratio]
    return rotate(latent.float(), rows[:, :32], rows[:, 32:]).to(torch.bfloat16).float()


def records(cache, layout, block_size, n):
    """(values, scales) byte rows of the first ``n`` slots of a V4.1 record or indexer key cache."""
    if layout.is_index:
        values, scales = formats.index_key_views(cache)
    else:
        values, scales = formats.record_views(cache, layout, block_size)
    return values.reshape(-1, values.shape[-1])[:n], scales.reshape(-1, scales.shape[-1])[:n]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("layout,ratio,length,cuts", [
    ("nvfp4_v41", 2, 41, (10, 11, 19, 24, 25, 26, 33)),          # prefill chunks, then widths 1 to 8
    ("index_mxfp4", 2, 30, (3, 4, 12, 17)),
    ("nvfp4_v41_inline", 1, 21, (5, 6, 14)),
    ("index_mxfp4", 1, 19, (1, 9, 12)),
])
def test_v41_chunked_calls_match_the_model(backend, layout, ratio, length, cuts):
    """V4.1: chunked prefill then decode / verify steps (the state carrying open pairs across calls)
    write the entries the model computes for the whole prompt at once."""
    gen = torch.Generator().manual_seed(2)
    lay = COMPRESSED_LAYOUTS[layout]
    D = lay.head_dim
    kv = torch.randn(length, D, generator=gen)
    score = 2 * torch.randn(length, D, generator=gen)
    weight = 1 + 0.1 * torch.randn(D, generator=gen)
    cs = cos_sin_cache(length + ratio)
    sbs, bs, eps = 4, 8, 1e-20
    n_pages = -(-length // sbs)
    state_table = torch.randperm(n_pages + 3, generator=gen)[:n_pages].to(torch.int32)[None]
    state = torch.full((n_pages + 3, sbs, 2 * D), float("nan"))
    entries = length // ratio
    nb = -(-entries // bs)
    cache = torch.zeros(lay.cache_shape(nb, bs), dtype=torch.uint8)
    bounds = (0, *cuts, length)
    for a, b in zip(bounds[:-1], bounds[1:]):
        pos = torch.arange(a, b)
        slots = torch.where((pos + 1) % ratio == 0, pos // ratio, -1)
        stateful = (score[a:b], None, state, state_table[0, pos // sbs].long() * sbs + pos % sbs, state_table,
                    torch.zeros(b - a, dtype=torch.int32)) if ratio == 2 else (None,) * 6
        sc, ape, st, sslots, table, req = stateful
        dsv4ops.compress_kv_insert(kv[a:b], sc, pos, ape, weight, cs, st, sslots, table, req, cache, slots,
                                   layout=layout, ratio=ratio, block_size=bs, eps=eps, backend=backend)
    want = model_entries_v41(kv, score, weight, eps, ratio, cs)
    if lay.is_index:
        keys = torch.zeros(nb * bs, D)
        keys[:entries] = want
        expect = formats.pack_index_keys(keys.view(nb, bs, D), layout=layout)
    else:
        expect = torch.zeros_like(cache)
        formats.write_kv(expect, layout, bs, torch.arange(entries), want)
    got, ref = records(cache, lay, bs, entries), records(expect, lay, bs, entries)
    verdict = Collector()
    fp4_records_close(verdict, "entries", got, ref, lay, block_amax(want, lay.scale_block))
    assert verdict.verdict().ok, verdict.verdict()
    assert (got[0] == ref[0]).float().mean() > 0.99                    # almost all bytes equal


# Contract decision (docs/ops.md §9): V4.1 rounds the normed latent to bf16, then ropes it.
@pytest.mark.parametrize("backend", BACKENDS)
def test_v41_latent_is_rounded_to_bf16_before_rope(backend):
    """Ratios 2 and 1 rotate the bf16 latent (what the model keeps and the indexer's wk reads) and
    round again; V4 rotates the fp32 normed row. fp8_ds_mla keeps the RoPE dims as bf16, so the
    entries show which: ratio 1 (no pooling) against both formulations."""
    gen = torch.Generator().manual_seed(3)
    T, bs = 64, 8
    kv = torch.randn(T, 512, generator=gen) * 3
    weight = 1 + 0.1 * torch.randn(512, generator=gen)
    pos = torch.randperm(4 * T, generator=gen)[:T]
    cs = cos_sin_cache(4 * T)
    cache = formats.allocate_kv_cache(T // bs, bs, "fp8_ds_mla")
    dsv4ops.compress_kv_insert(kv, None, pos, None, weight, cs, None, None, None, None, cache, torch.arange(T),
                               layout="fp8_ds_mla", ratio=1, block_size=bs, eps=1e-20, backend=backend)
    got = formats.read_kv(cache, "fp8_ds_mla", bs, torch.arange(T))[:, formats.NOPE_DIM:]
    normed = kv * torch.rsqrt(kv.square().mean(-1, keepdim=True) + 1e-20) * weight
    rows = cs[pos]
    v41, v4 = (rotate(x, rows[:, :32], rows[:, 32:]).to(torch.bfloat16).float()[:, formats.NOPE_DIM:]
               for x in (normed.to(torch.bfloat16).float(), normed))
    assert (got == v41).float().mean() > 0.99
    assert (got != v4).float().mean() > 0.05                        # the two formulations do differ


# --- the Triton paths ------------------------------------------------------------------------

PATH_CASES = [dict(layout="fp8_ds_mla", ratio=4, reqs=((0, 9), (5, 1), (7, 1), (30, 6)), block_size=4, pad=1, dp_pad=1),
         dict(layout="index_fp8", ratio=4, reqs=((2, 7), (11, 2), (0, 4)), block_size=8, skip_slot=True, pad=1),
         dict(layout="fp8_ds_mla", ratio=128, reqs=((100, 30), (127, 2), (0, 3)), block_size=2, pad=1, decode=3),
         dict(layout="nvfp4_v41", ratio=2, reqs=((0, 9), (5, 8), (3, 2)), block_size=4, pad=1, decode=3, dp_pad=1,
              latent=True),
         dict(layout="index_mxfp4", ratio=1, reqs=((0, 9), (5, 8)), block_size=8, pad=2, skip_slot=True)]


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
@pytest.mark.parametrize("layout,ratio,window", [("fp8_ds_mla", 4, 8), ("nvfp4_v41", 2, 2), ("index_mxfp4", 2, 2),
                                                 ("index_mxfp4", 1, 1)])
def test_compress_nan_stays_in_the_entries_whose_window_reads_it(backend, layout, ratio, window):
    """§9: a NaN in a token's kv or score is copied into its state row exactly; only the entries
    whose window pools that token are unspecified, every other written byte is as without it
    (C4 windows pool 8 positions, V4.1 pairs 2, ratio 1 the token alone)."""
    bs = 4
    kw = build_inputs("compress_kv_insert", "cpu", torch.Generator().manual_seed(11), layout=layout, ratio=ratio,
                      reqs=((0, 16),), block_size=bs)
    clean = {k: v.clone() if isinstance(v, torch.Tensor) else v for k, v in kw.items()}
    dsv4ops.compress_kv_insert(**clean, backend="reference")
    dirty = {k: v.clone() if isinstance(v, torch.Tensor) else v for k, v in kw.items()}
    p0 = 5
    row = int((dirty["positions"] == p0).nonzero()[0])
    dirty["kv"][row, 7] = float("nan")
    dsv4ops.compress_kv_insert(**dirty, backend=backend)
    if ratio != 1:
        state_slot = int(dirty["state_slot_mapping"][row])
        got_state, want_state = (kw_["state_cache"].view(-1, kw_["state_cache"].shape[-1]) for kw_ in (dirty, clean))
        assert got_state[state_slot, 7].isnan()
        others = torch.arange(got_state.shape[0]) != state_slot
        assert torch.equal(got_state[others].view(torch.int32), want_state[others].view(torch.int32))
    pos = dirty["positions"]
    reads = ((pos + 1) % ratio == 0) & (pos >= p0) & (pos - window < p0)
    unspecified = dirty["slot_mapping"][reads]
    assert len(unspecified) == window // ratio
    owned = torch.zeros_like(dirty["kv_cache"], dtype=torch.bool)
    lay = COMPRESSED_LAYOUTS[layout]
    if lay.is_index:
        page = owned.view(owned.shape[0], -1)
        for s in unspecified.tolist():
            page[s // bs, (s % bs) * lay.data_bytes:(s % bs + 1) * lay.data_bytes] = True
            page[s // bs, bs * lay.data_bytes + (s % bs) * lay.scale_bytes:][:lay.scale_bytes] = True
    else:
        data, scales = formats.record_views(owned, lay, bs)
        data[unspecified // bs, unspecified % bs] = True
        scales[unspecified // bs, unspecified % bs] = True
    cache_got, cache_want = dirty["kv_cache"], clean["kv_cache"]
    assert not torch.equal(cache_got[owned], cache_want[owned])       # the NaN reached those entries
    assert torch.equal(cache_got[~owned], cache_want[~owned])


# --- both fp8 paths on the V4.1 writers ------------------------------------------------------

@needs_triton
@pytest.mark.parametrize("params", [
    dict(layout="nvfp4_v41", ratio=2, reqs=((0, 9), (5, 8)), block_size=4, pad=1),      # e4m3 scales
    dict(layout="mxfp8_v41_inline", ratio=2, reqs=((3, 6),), decode=2, block_size=4),   # e4m3 values
    dict(layout="index_fp8", ratio=1, reqs=((0, 7), (4, 8)), block_size=8, pad=1),
    dict(layout="index_mxfp4", ratio=1, reqs=((2, 5),), block_size=8)], ids=lambda p: f"{p['layout']}-{p['ratio']}")
def test_v41_writers_write_the_same_bytes_on_both_fp8_paths(env, params):
    """The hardware and the software fp8 path write the same state and cache bytes, each within
    the conformance rule of the reference."""
    from dsv4ops.tensors import clone_kwargs

    kwargs = make_case("compress_kv_insert", **params).build("cpu", 0)
    ref = clone_kwargs(kwargs)
    dsv4ops.compress_kv_insert(**ref, backend="reference")
    written = {}
    for path in ("hw", "soft"):
        env(DSV4OPS_TRITON_TUNING=f"fp8_path={path}")
        kw = clone_kwargs(kwargs)
        want = "triton" if path == "hw" else "triton (fp8 in software)"
        assert dsv4ops.explain("compress_kv_insert", **kw).selected.name == want
        dsv4ops.compress_kv_insert(**kw, backend="triton")
        assert OPS["compress_kv_insert"].spec.conformance.compare(params, ref, None, kw, None).ok, path
        written[path] = kw["kv_cache"]
    assert torch.equal(written["hw"], written["soft"])
