"""Op (docs/ops.md §9): the V4 / V4.1 KV compressor. Saves each token's KV / gate rows in the
compressor state cache, and at every ``ratio``-th position pools the window into one entry (softmax
gate, RMSNorm, RoPE) written quantized into the compressed cache (``fp8_ds_mla``, ``nvfp4_v41*``,
``mxfp8_v41*``) or the indexer key cache (``index_fp8``, ``index_mxfp4``); V4.1's ratio 1 pools
nothing and keeps no state."""
from __future__ import annotations

from collections.abc import Callable
from typing import Optional

import torch
from torch import Tensor

from .. import formats, quant
from ..cache_checks import check_kv_cache
from ..checker import TOKENS_WRITTEN, Checker, describe
from ..formats import Layout
from ..opspec import Arg, BenchShapes, Conformance, OpSpec, define
from ..sampling import change, cos_sin_cache, randint, randn, set_args, to_device
from ..shapes import C4_BLOCK, C128_BLOCK
from ..tolerance import (BF16_ROUNDING, Collector, Verdict, bf16_ulp_close, block_amax, fp8_blocks_close,
                         scale_step_allowed)

STATE_ARGS = ("state_cache", "state_slot_mapping", "state_block_table", "token_to_req")   # None for ratio 1
V41_EPS = 1e-20                 # DeepSeek-V4.1's rms_norm_eps (the conformance cases' eps for ratios 2, 1)


def check(c: Checker, a):
    try:
        layout = Layout.of(a.layout, among=formats.COMPRESSED_LAYOUTS)
    except ValueError:
        c.fail("layout", f"must be one of {list(formats.COMPRESSED_LAYOUTS)}, got {a.layout!r}")
    D = layout.head_dim
    c.int_arg("ratio", a.ratio, choices=formats.COMPRESSION_RATIOS)
    v4, stateful = a.ratio in formats.V4_COMPRESSION_RATIOS, a.ratio != 1
    width = formats.window_overlap(a.ratio) * D
    c.tensor("kv", a.kv, dtype=(torch.float32, torch.bfloat16), shape=("T", width), anchor=True,
             last_dim_contiguous=True)
    T = a.kv.shape[0]
    if stateful:
        c.tensor("score", a.score, dtype=(torch.float32, torch.bfloat16), shape=(T, width), last_dim_contiguous=True)
    elif a.score is not None:
        c.fail("score", f"must be None for ratio 1 (no gate: each token is its own entry), got {describe(a.score)}")
    c.tensor("positions", a.positions, dtype=torch.int64, shape=(T,))
    if v4:
        c.tensor("ape", a.ape, dtype=torch.float32, shape=(a.ratio, width), contiguous=True)
    elif a.ape is not None:
        c.fail("ape", f"must be None for ratio {a.ratio} (DeepSeek-V4.1 gates without a position bias), "
                      f"got {describe(a.ape)}")
    c.tensor("norm_weight", a.norm_weight, dtype=(torch.float32, torch.bfloat16), shape=(D,))
    c.tensor("cos_sin_cache", a.cos_sin_cache, dtype=torch.float32, shape=("max_pos", formats.ROPE_DIM),
             contiguous=True)
    if stateful:
        c.tensor("state_cache", a.state_cache, dtype=torch.float32, shape=("num_state_blocks", "state_block_size",
                 2 * width), last_dim_contiguous=True)
        counted = "state_slot_mapping"
    else:
        for name in STATE_ARGS:
            if getattr(a, name) is not None:
                c.fail(name, f"must be None for ratio 1 (it keeps no state), got {describe(getattr(a, name))}")
        counted = "slot_mapping"
    c.tensor(counted, getattr(a, counted), dtype=torch.int64, shape=(TOKENS_WRITTEN,))
    n = getattr(a, counted).shape[0]                 # T': the tokens that write (T' <= T)
    if n > T:
        c.fail(counted, f"must have at most T={T} entries (T': one per token that writes, T' <= T), got {n}")
    if stateful:
        c.tensor("state_block_table", a.state_block_table, dtype=torch.int32, shape=("num_reqs", "max_state_blocks"))
        c.tensor("token_to_req", a.token_to_req, dtype=torch.int32, shape=(n,))
    c.int_arg("block_size", a.block_size, minimum=1)
    check_kv_cache(c, "kv_cache", a.kv_cache, layout, a.block_size)
    if stateful:
        c.tensor("slot_mapping", a.slot_mapping, dtype=torch.int64, shape=(n,))
    c.float_arg("eps", a.eps, positive=True)
    c.optional("latent", a.latent, dtype=torch.bfloat16, shape=(n, D), last_dim_contiguous=True)
    c.in_range("positions", a.positions, 0, a.cos_sin_cache.shape[0], what="positions (rows of cos_sin_cache)")
    n_slots = a.kv_cache.shape[0] * a.block_size
    if not stateful:
        c.in_range("slot_mapping", a.slot_mapping, None, n_slots, what="slots (negative = skip)")
        return a._replace(layout=layout)
    n_state_slots = a.state_cache.shape[0] * a.state_cache.shape[1]
    c.in_range("state_slot_mapping", a.state_slot_mapping, None, n_state_slots, what="state slots (negative = skip)")
    c.in_range("token_to_req", a.token_to_req, 0, a.state_block_table.shape[0], what="request ids")
    c.in_range("state_block_table", a.state_block_table, 0, a.state_cache.shape[0], what="state block ids")
    if n and c.values_checked(a.positions):
        live = a.state_slot_mapping >= 0
        pages = a.positions[:n][live] // a.state_cache.shape[1]
        c.in_range("positions", pages, None, a.state_block_table.shape[1],
                   what="state pages (position // state_block_size, within state_block_table's width)")
        completes = live & ((a.positions[:n] + 1) % a.ratio == 0)       # the only slots the op reads
        c.in_range("slot_mapping", a.slot_mapping[completes], None, n_slots,
                   what="slots of the entries these tokens complete (negative = skip; the other tokens' "
                        "values are not read)")
    return a._replace(layout=layout)


def fake(a):
    return None


# ---------------------------------------------------------------------------------------------
# Conformance: sample inputs, cases, comparison rule, error inputs, bench shapes

def inputs(device, gen, *, layout, ratio, block_size, reqs=(), decode=0, pad=0, dp_pad=0,
                       dtype=torch.float32, skip_slot=False, page_bytes=None, latent=False):
    """Requests ``reqs = ((prior, new), ...)``: ``prior`` tokens compressed by earlier calls (their
    last window's state rows are random values, every other state row is NaN: nothing may read it),
    ``new`` tokens in this call. ``kv`` / ``score`` are the halves of one [T, 2c*D] projection
    (strided rows). ``pad`` dummy tokens (state slot -1; ratio 1: slot -1) follow, then ``dp_pad``
    tokens past the slot mappings. Tokens that close no window carry slots on a spare page (writing
    them is a bug); ``skip_slot`` gives the first closing token slot -1. ``decode=N`` adds N requests
    of one token each, every other one closing a window. Ratio 1: no score, no state (None).
    ``latent``: a ``latent`` buffer of NaN (rows of tokens that write no entry must stay NaN)."""
    reqs = tuple(reqs) + tuple((ratio * (8 + i) - 1 - i % 2, 1) for i in range(decode))
    c, D = formats.window_overlap(ratio), Layout.of(layout, among=formats.COMPRESSED_LAYOUTS).head_dim
    width, sbs = c * D, 8 if ratio == 128 else 4
    ends = [prior + new for prior, new in reqs]
    state_pages = [-(-e // sbs) for e in ends]
    entry_pages = [-(-(e // ratio) // block_size) for e in ends]
    nsb, nb = sum(state_pages) + 1, sum(entry_pages) + 1          # + a spare page each
    sperm, kperm = torch.randperm(nsb, generator=gen), torch.randperm(nb, generator=gen)
    spare = int(kperm[-1])
    state_table = torch.zeros(len(reqs), max(state_pages + [1]), dtype=torch.int32)
    entry_table = torch.zeros(len(reqs), max(entry_pages + [1]), dtype=torch.int64)
    state = torch.full((nsb, sbs, 2 * width), float("nan"))
    positions, req_of, sslots, slots = [], [], [], []
    s_used = k_used = 0
    for r, (prior, new) in enumerate(reqs):
        state_table[r, :state_pages[r]] = sperm[s_used:s_used + state_pages[r]].to(torch.int32)
        entry_table[r, :entry_pages[r]] = kperm[k_used:k_used + entry_pages[r]]
        s_used, k_used = s_used + state_pages[r], k_used + entry_pages[r]
        for q in range(max(0, prior - c * ratio), prior):          # the state earlier calls left
            state[state_table[r, q // sbs], q % sbs] = torch.cat([randn(gen, width), 2 * randn(gen, width)])
        for q in range(prior, prior + new):
            positions.append(q)
            req_of.append(r)
            sslots.append(int(state_table[r, q // sbs]) * sbs + q % sbs)
            e = q // ratio
            slots.append(int(entry_table[r, e // block_size]) * block_size + e % block_size
                         if (q + 1) % ratio == 0 else spare * block_size + int(randint(gen, 0, block_size, ())))
    if skip_slot:
        first = next(i for i, q in enumerate(positions) if (q + 1) % ratio == 0)
        slots[first] = -1
    max_pos = max(ends + [1]) + ratio
    for _ in range(pad):
        positions.append(int(randint(gen, 0, max_pos, ())))
        req_of.append(0)
        sslots.append(-1)
        slots.append(-1 if ratio == 1 else spare * block_size)
    positions += [int(randint(gen, 0, max_pos, ())) for _ in range(dp_pad)]
    T = len(positions)
    proj = randn(gen, T, 2 * width) * torch.cat([0.05 + 2 * torch.rand(T, 1, generator=gen),
                                                   torch.full((T, 1), 2.0)], dim=1).repeat_interleave(width, 1)
    shape = Layout.of(layout, among=formats.COMPRESSED_LAYOUTS).cache_shape(nb, block_size, page_bytes)
    cache = randint(gen, 0, 256, shape).to(torch.uint8)          # random bytes: a stray write shows
    proj = proj.to(dtype)
    stateful = ratio != 1
    kwargs = dict(kv=proj[:, :width], score=proj[:, width:] if stateful else None,
                  positions=torch.tensor(positions, dtype=torch.int64),
                  ape=0.5 * randn(gen, ratio, width) if ratio in formats.V4_COMPRESSION_RATIOS else None,
                  norm_weight=(1 + 0.1 * randn(gen, D)).to(dtype), cos_sin_cache=cos_sin_cache(max_pos),
                  state_cache=state if stateful else None,
                  state_slot_mapping=torch.tensor(sslots, dtype=torch.int64) if stateful else None,
                  state_block_table=state_table if stateful else None,
                  token_to_req=torch.tensor(req_of, dtype=torch.int32) if stateful else None, kv_cache=cache,
                  slot_mapping=torch.tensor(slots, dtype=torch.int64), layout=layout, ratio=ratio,
                  block_size=block_size, eps=1e-6 if ratio in formats.V4_COMPRESSION_RATIOS else V41_EPS,
                  latent=torch.full((len(slots), D), float("nan"), dtype=torch.bfloat16) if latent else None)
    return to_device(kwargs, device)


RESIDUES = {4: (0, 1, 2, 3), 128: (0, 1, 63, 64, 127), 2: (0, 1)}      # prompt lengths mod ratio users hit
V41_BLOCK = 64                  # entries per page of the V4.1 compressed caches and index keys in the full tier


def residue_cases(tier: str):
    """Every residue of the prompt length mod the ratio, in one call (requests of ``base + r``
    tokens) and split (``base + r`` tokens compressed by earlier calls, then more in this one)."""
    for layout, ratio, bs in (("fp8_ds_mla", 4, 4 if tier == "quick" else C4_BLOCK), ("index_fp8", 4, 8),
                              ("fp8_ds_mla", 128, C128_BLOCK), ("nvfp4_v41", 2, 4 if tier == "quick" else V41_BLOCK),
                              ("index_mxfp4", 2, 8 if tier == "quick" else V41_BLOCK)):
        base = {4: 12, 128: 128, 2: 6}[ratio] if tier == "quick" else {4: 57344, 128: 8192, 2: 8192}[ratio]
        residues = RESIDUES[ratio]
        yield dict(layout=layout, ratio=ratio, reqs=tuple((0, base + r) for r in residues), block_size=bs)
        yield dict(layout=layout, ratio=ratio, reqs=tuple((base + r, ratio + 2) for r in residues), block_size=bs)


def cases(tier: str):
    """Both tiers: empty calls, partial windows carried across calls, padding, skipped slots, decode
    batches, and every prompt-length residue in one call and split."""
    yield from residue_cases(tier)
    if tier == "quick":
        yield dict(layout="fp8_ds_mla", ratio=4, reqs=((0, 0),), block_size=4)
        yield dict(layout="fp8_ds_mla", ratio=4, reqs=((0, 9), (5, 1), (7, 1), (30, 6)), block_size=4,
                   pad=1, dp_pad=1)
        yield dict(layout="index_fp8", ratio=4, reqs=((2, 7), (11, 1), (0, 4)), block_size=8,
                   skip_slot=True, dtype=torch.bfloat16)
        yield dict(layout="fp8_ds_mla", ratio=128, reqs=((100, 30), (127, 1), (0, 3)),
                   block_size=C128_BLOCK)
        yield dict(layout="fp8_ds_mla", ratio=4, decode=6, block_size=4)
        yield dict(layout="fp8_ds_mla", ratio=4, reqs=((13, 8), (22, 5), (40, 8)), block_size=4)   # verify widths 8, 5
        yield from v41_cases(tier)
        return
    for layout, ratio, bs in (("fp8_ds_mla", 4, C4_BLOCK), ("index_fp8", 4, C4_BLOCK), ("fp8_ds_mla", 128, C128_BLOCK)):
        yield dict(layout=layout, ratio=ratio, decode=128, block_size=bs)   # 128 decode requests
        yield dict(layout=layout, ratio=ratio, reqs=((0, 1500), (513, 700), (4093, 3)),
                   block_size=bs, pad=5, dp_pad=3)                  # prefill chunks
    yield dict(layout="fp8_ds_mla", ratio=4, reqs=((8, 4), (0, 8192)), block_size=C4_BLOCK,
               dtype=torch.bfloat16, skip_slot=True)
    yield from v41_cases(tier)


def v41_cases(tier: str):
    """nvfp4_v41 split and inline for the V4 ratios, padded and exact pages; the V4.1 ratios 2 and 1
    into every V4.1 record and both key layouts: empty calls, partial pairs carried across calls,
    DSpark verify widths up to 8 tokens a request (pairs closing mid-call), padding, skipped slots,
    decode batches, bf16 projections, the latent output."""
    for i, (layout, ratio) in enumerate((("nvfp4_v41", 4), ("nvfp4_v41_inline", 128), ("nvfp4_v41_inline", 4))):
        bs = (4 if ratio == 4 else 2) if tier == "quick" else (C4_BLOCK if ratio == 4 else C128_BLOCK)
        reqs = ((0, 9), (5, 1), (30, 6)) if ratio == 4 else ((100, 30), (127, 1), (0, 3))
        if tier == "full":
            reqs = ((0, 1500), (513, 700), (4093, 3))
        page = Layout.of(layout).min_page_bytes(bs) + (0 if i % 2 else 96)
        yield dict(layout=layout, ratio=ratio, reqs=reqs, block_size=bs, page_bytes=page, pad=1, dp_pad=1,
                   skip_slot=i == 2)
    if tier == "quick":
        yield dict(layout="nvfp4_v41", ratio=2, reqs=((0, 0),), block_size=4)
        yield dict(layout="index_mxfp4", ratio=1, reqs=((0, 0),), block_size=8)
        yield dict(layout="nvfp4_v41", ratio=2, reqs=((0, 9), (5, 1), (7, 8), (30, 6)), block_size=4, pad=1,
                   dp_pad=1, page_bytes=Layout.of("nvfp4_v41").min_page_bytes(4) + 96, latent=True)
        yield dict(layout="nvfp4_v41_inline", ratio=2, reqs=((3, 5), (0, 2), (10, 1)), block_size=4, skip_slot=True,
                   dtype=torch.bfloat16)
        yield dict(layout="mxfp8_v41", ratio=2, reqs=((1, 8), (6, 7)), decode=3, block_size=4)
        yield dict(layout="index_mxfp4", ratio=2, reqs=((0, 7), (9, 8), (4, 3)), block_size=8, pad=2)
        yield dict(layout="index_fp8", ratio=2, reqs=((2, 5), (11, 1)), block_size=8, skip_slot=True)
        yield dict(layout="nvfp4_v41", ratio=1, reqs=((0, 5), (9, 8)), block_size=4, pad=2, dp_pad=1)
        yield dict(layout="mxfp8_v41_inline", ratio=1, reqs=((0, 3), (2, 8)), block_size=4,
                   page_bytes=Layout.of("mxfp8_v41_inline").min_page_bytes(4))
        yield dict(layout="index_mxfp4", ratio=1, reqs=((0, 8), (3, 1), (17, 6)), block_size=8, skip_slot=True,
                   pad=1, dtype=torch.bfloat16, latent=True)
        yield dict(layout="index_fp8", ratio=1, reqs=((5, 7),), decode=4, block_size=8)
        return
    verify = tuple((37 * i + i % 2, 1 + i % 8) for i in range(128))       # 128 requests, widths 1 to 8
    for layout, ratio in (("nvfp4_v41", 2), ("nvfp4_v41_inline", 1), ("index_mxfp4", 2), ("index_mxfp4", 1),
                          ("index_fp8", 1)):
        yield dict(layout=layout, ratio=ratio, reqs=verify, block_size=V41_BLOCK, latent=ratio == 2)
        yield dict(layout=layout, ratio=ratio, reqs=((0, 1500), (513, 700), (4093, 3)), block_size=V41_BLOCK,
                   pad=5, dp_pad=3, skip_slot=True)


def entries_written(kw: dict) -> torch.Tensor:
    """bool [T']: the tokens that write an entry (live, closing a window, with a slot)."""
    slots = kw["slot_mapping"]
    if kw["ratio"] == 1:
        return slots >= 0
    n = slots.shape[0]
    return (kw["state_slot_mapping"] >= 0) & ((kw["positions"][:n] + 1) % kw["ratio"] == 0) & (slots >= 0)


def compare(params, ref_kwargs, ref_result, got_kwargs, got_result) -> Verdict:
    """State cache bit-exact (a copy and one fp32 add); each written entry's scales equal, or one
    power of two (one e4m3 code for NVFP4) off where the block's amax is at the boundary between the
    two (the bf16 entries may differ by an ulp), and its values within one fp8 / e2m1 step,
    fp8_ds_mla's RoPE bf16 values within one ulp; every other cache byte exact."""
    c = Collector()
    kw = ref_kwargs
    if kw["state_cache"] is not None:
        c.require(torch.equal(got_kwargs["state_cache"].view(torch.int32), kw["state_cache"].view(torch.int32)),
                  "state_cache: rows differ bitwise (saved rows are an exact copy, score + ape one fp32 add)")
    slots = kw["slot_mapping"][entries_written(kw)]
    got, ref, bs = got_kwargs["kv_cache"], kw["kv_cache"], kw["block_size"]
    owned = torch.zeros_like(ref, dtype=torch.bool)
    block, off = slots // bs, slots % bs
    layout = Layout.of(kw["layout"], among=formats.COMPRESSED_LAYOUTS)
    if layout.is_paged_bytes:
        (gd, gs), (rd, rs), (od, os_) = (formats.record_views(t, layout, bs) for t in (got, ref, owned))
        od[block, off] = True
        os_[block, off, : formats.NUM_TILES if layout.is_ds_mla else None] = True   # ds_mla's pad byte: exact
        got_e, ref_e = (gd[block, off], gs[block, off]), (rd[block, off], rs[block, off])
    else:
        (gv, gs), (rv, rs) = (formats.index_key_views(t) for t in (got, ref))
        page = owned.view(owned.shape[0], -1)
        ar = lambda k: torch.arange(k, device=ref.device)
        page[block[:, None], off[:, None] * layout.data_bytes + ar(layout.data_bytes)] = True
        page[block[:, None], bs * layout.data_bytes + off[:, None] * layout.scale_bytes + ar(layout.scale_bytes)] = True
        got_e, ref_e = (gv[block, off], gs[block, off]), (rv[block, off], rs[block, off])
    entries = OP.spec.reference_function("entry_rows")(OP.validate_call(**kw).args)[2]
    if layout.kind in (Layout.NVFP4, Layout.INDEX_MXFP4):
        fp4_records_close(c, "entries", got_e, ref_e, layout, block_amax(entries, layout.scale_block))
    elif layout.kind == Layout.MXFP8:
        ue8m0 = lambda e: (e[0].view(torch.float8_e4m3fn), quant.ue8m0_to_float(e[1]))
        fp8_blocks_close(c, "entries", ue8m0(got_e), ue8m0(ref_e), layout.scale_block,
                         block_amax(entries, layout.scale_block), BF16_ROUNDING)
    elif layout.is_ds_mla:
        nope = lambda e: (e[0][:, : formats.NOPE_DIM].view(torch.float8_e4m3fn),
                          quant.ue8m0_to_float(e[1][:, : formats.NUM_TILES]))
        fp8_blocks_close(c, "entries", nope(got_e), nope(ref_e), formats.TILE,
                         block_amax(entries[:, : formats.NOPE_DIM], formats.TILE), BF16_ROUNDING)
        bf16_ulp_close(c, "entry RoPE bytes", got_e[0][:, formats.NOPE_DIM:], ref_e[0][:, formats.NOPE_DIM:])
    else:
        fp8_blocks_close(c, "keys", (got_e[0], got_e[1][:, None]), (ref_e[0], ref_e[1][:, None]), formats.INDEX_DIM,
                         block_amax(entries, formats.INDEX_DIM), BF16_ROUNDING)
    mismatch = (got != ref) & ~owned
    c.require(not bool(mismatch.any()), f"kv_cache: {int(mismatch.sum())} bytes differ outside the written "
              f"entries' values and scales (pad bytes, other slots, page padding)")
    if kw.get("latent") is not None:                        # callers may leave the default out
        done = entries_written(kw)
        bf16_ulp_close(c, "latent", got_kwargs["latent"][done].view(torch.uint8), kw["latent"][done].view(torch.uint8))
        c.require(torch.equal(got_kwargs["latent"][~done].view(torch.int16), kw["latent"][~done].view(torch.int16)),
                  "latent: rows of tokens that write no entry were written")
    return c.verdict()


def fp4_records_close(c: Collector, name: str, got: tuple, ref: tuple, layout: Layout, amax: Tensor) -> None:
    """e2m1 records (packed ``[N, D / 2]``, scale bytes ``[N, D / block]``: NVFP4's e4m3 bytes or
    MXFP4's UE8M0 bytes): each scale byte equal to the reference's, or one code (one power of two for
    UE8M0) off where the reference block's ``amax`` (before rounding) lies within one bf16 ulp of the
    boundary between the two (NVFP4: 6 times the midpoint of the two e4m3 values, MXFP4: 6 times the
    smaller scale); each dequantized value within one e2m1 step (at the larger scale, plus 2^-3 of
    it) of the reference's (the bf16 entries may differ by an ulp)."""
    (gp, gs), (rp, rs) = got, ref
    if gp.numel() == 0:
        return
    code_diff = (gs.to(torch.int16) - rs.to(torch.int16)).abs()
    c.require(bool((code_diff <= 1).all()), f"{name} scales: {int((code_diff > 1).sum())} scale bytes more than one "
                                             f"code from the reference's")
    if layout.kind == Layout.NVFP4:
        decode, scale_of = quant.decode_nvfp4, lambda s: s.view(torch.float8_e4m3fn).float()
        boundary = 3 * (scale_of(gs).double() + scale_of(rs).double())
    else:
        decode, scale_of = quant.decode_mxfp4, quant.ue8m0_to_float
        boundary = quant.E2M1_MAX * torch.minimum(scale_of(gs), scale_of(rs)).double()
    scale_step_allowed(c, name, code_diff == 1, amax, boundary, BF16_ROUNDING)
    got_x, ref_x = decode(gp, gs), decode(rp, rs)
    scale = torch.maximum(scale_of(gs), scale_of(rs)).repeat_interleave(layout.scale_block, -1)
    step = torch.where(ref_x.abs() >= 4 * scale, 2.0, torch.where(ref_x.abs() >= 2 * scale, 1.0, 0.5))
    diff, bound = (got_x - ref_x).abs(), step * scale + 2 ** -3 * ref_x.abs()
    bad = ~(diff <= bound) & ~(torch.isnan(got_x) & torch.isnan(ref_x))
    c.err(float(torch.nan_to_num(diff / bound, nan=0.0).max()))
    c.require(not bool(bad.any()), f"{name}: {int(bad.sum())} dequantized values more than one e2m1 step off, "
              f"first at {torch.nonzero(bad)[0].tolist() if bad.any() else None}")


def cost(kw: dict) -> tuple[int, int]:
    """(bytes, flops) a kernel must move / do at least."""
    done = int(entries_written(kw).sum())
    entry = Layout.of(kw["layout"], among=formats.COMPRESSED_LAYOUTS).token_bytes
    if kw["ratio"] == 1:                                      # read the token's kv row, write its entry
        return done * (kw["kv"].element_size() * kw["kv"].shape[1] + entry), 0
    live = kw["state_slot_mapping"] >= 0
    row = kw["state_cache"].shape[2] * 4                      # one state row: [kv, score] fp32
    # save: read kv + score, write the row; each entry reads c*ratio positions of a row's 1/c
    return (int(live.sum()) * ((kw["kv"].element_size() + kw["score"].element_size()) * kw["kv"].shape[1] + row)
            + done * (kw["ratio"] * row + entry)), 0


def as_v41(ratio: int, **changes) -> Callable[[dict], None]:
    """An error input's change: the error base (a C4 call) made a valid call of V4.1 ``ratio``
    (half-width projections and state rows, no ape; ratio 1 without score and state), then
    ``changes``."""
    def apply(kw: dict) -> None:
        D = kw["kv"].shape[1] // 2
        kw.update(kv=kw["kv"][:, :D], score=kw["score"][:, :D], ape=None, ratio=ratio,
                  state_cache=kw["state_cache"][..., : 2 * D])
        if ratio == 1:
            kw.update(score=None, **dict.fromkeys(STATE_ARGS))
        kw.update(changes)
    return apply


ERRORS = (
    ("layout", set_args(layout="bf16")),
    ("layout", set_args(layout="fp8_ds_mla_fnuz")),
    ("ratio", set_args(ratio=8)),
    ("kv", change("kv", lambda t: t[:, :512])),
    ("kv", change("kv", lambda t: t.half())),
    ("score", change("score", lambda t: t[:3])),
    ("positions", change("positions", lambda t: t.int())),
    ("positions", change("positions", lambda t: t + 1000)),
    ("ape", change("ape", lambda t: t[:2].contiguous())),
    ("norm_weight", change("norm_weight", lambda t: t[:128].contiguous())),
    ("cos_sin_cache", change("cos_sin_cache", lambda t: t.double())),
    ("state_cache", change("state_cache", lambda t: t[..., :1024].contiguous())),
    ("state_slot_mapping", change("state_slot_mapping", lambda t: t + 1000)),
    ("state_block_table", change("state_block_table", lambda t: t + 1000)),
    ("token_to_req", change("token_to_req", lambda t: t + 5)),
    ("token_to_req", change("token_to_req", lambda t: t.long())),
    ("kv_cache", set_args(block_size=8)),
    ("kv_cache", set_args(layout="nvfp4_v41", block_size=16)),         # 2880-byte pages < 16 * 288
    ("slot_mapping", change("slot_mapping", lambda t: t[:2])),
    ("slot_mapping", change("slot_mapping", lambda t: t + 1000)),
    ("eps", set_args(eps=0.0)),
    ("ape", set_args(ape=None)),                                        # V4 ratios need the gate bias
    ("ape", lambda kw: as_v41(2, ape=kw["ape"][:, :kw["kv"].shape[1] // 2])(kw)),    # V4.1 has none
    ("kv", lambda kw: as_v41(2, kv=kw["kv"])(kw)),                    # C4's width
    ("state_cache", as_v41(2, state_cache=None)),
    ("score", as_v41(1, score=torch.zeros(3, 512))),
    ("state_cache", lambda kw: as_v41(1, state_cache=kw["state_cache"][..., :1024])(kw)),
    ("token_to_req", lambda kw: as_v41(1, token_to_req=kw["token_to_req"])(kw)),
    ("slot_mapping", as_v41(1, slot_mapping=torch.full((99,), -1))),
    ("slot_mapping", as_v41(1, slot_mapping=torch.full((3,), 1 << 40))),
)

SPEC = OpSpec(
    name="compress_kv_insert",
    section=9,
    doc="""Save KV / gate rows in the compressor state; pool every ``ratio``-th position's window into
    one compressed entry (softmax gate, RMSNorm, RoPE at the window's first position), quantized
    into ``kv_cache`` at ``slot_mapping``. Ratios 4, 128 (V4) and 2, 1 (V4.1: no ape; ratio 1 pools
    nothing and keeps no state: score and the four state arguments are None).

    kv, score fp32 or bf16 [T, c*D] (c = 2 for ratio 4, else 1; D = 512 for the attention layouts,
    128 for "index_fp8" / "index_mxfp4"), positions int64 [T], ape fp32 [ratio, c*D] (V4 only),
    norm_weight [D], cos_sin_cache fp32 [max_pos, 64], state_cache fp32 [num_state_blocks,
    state_block_size, 2*c*D], state_slot_mapping / slot_mapping int64 [T'] (T' <= T, negative =
    skip), state_block_table int32 [num_reqs, max_state_blocks], token_to_req int32 [T']. Writes
    state_cache and kv_cache; returns None.""",
    args=(
        Arg("kv", Tensor, doc="fp32/bf16 [T, c*D], the KV projection"),
        Arg("score", Optional[Tensor], doc="fp32/bf16 [T, c*D], the gate projection; None for ratio 1"),
        Arg("positions", Tensor, doc="int64 [T]"),
        Arg("ape", Optional[Tensor], doc="fp32 [ratio, c*D], learned position bias of the gate (ratios 4, 128); "
                                          "None for ratios 2, 1"),
        Arg("norm_weight", Tensor, doc="fp32/bf16 [D], RMSNorm weight"),
        Arg("cos_sin_cache", Tensor, doc="fp32 [max_pos, 64]"),
        Arg("state_cache", Optional[Tensor], mutated=True,
            doc="fp32 [num_state_blocks, state_block_size, 2*c*D], per-token [kv, score (+ ape)] rows; "
                "None for ratio 1 (so are the next three)"),
        Arg("state_slot_mapping", Optional[Tensor], doc="int64 [T'], negative = skip the token"),
        Arg("state_block_table", Optional[Tensor], doc="int32 [num_reqs, max_state_blocks]"),
        Arg("token_to_req", Optional[Tensor], doc="int32 [T']"),
        Arg("kv_cache", Tensor, mutated=True,
            doc="uint8 pages of the compressed cache in `layout` (formats.allocate_kv_cache)"),
        Arg("slot_mapping", Tensor, doc="int64 [T'], compressed slot written at a window's last token "
                                        "(ratio 1: every token's; negative = skip)"),
        Arg("layout", Layout, keyword_only=True,
            doc='"fp8_ds_mla", "nvfp4_v41[_inline]", "mxfp8_v41[_inline]" (the attention caches) or '
                '"index_fp8", "index_mxfp4" (the indexer keys)'),
        Arg("ratio", int, keyword_only=True,
            doc="4 (C4, overlapping windows), 128 (C128); V4.1: 2 (pairs) or 1 (every token)"),
        Arg("block_size", int, keyword_only=True, doc="entries per page of kv_cache"),
        Arg("eps", float, 1e-6, keyword_only=True, doc="RMSNorm epsilon (> 0)"),
        Arg("latent", Optional[Tensor], None, keyword_only=True, mutated=True,
            doc="bf16 [T', D] or None: row t receives the un-rotated bf16 latent of the entry token t writes "
                "(the input of V4.1's indexer wk); other rows untouched"),
    ),
    outputs="()",
    check=check,
    fake=fake,
    out_variant_only=True,
    reference="dsv4ops.reference.impl.compress_kv_insert:compress_kv_insert",
    conformance=Conformance(
        inputs=inputs,
        cases=cases,
        typical=dict(layout="fp8_ds_mla", ratio=4, reqs=((3, 1), (7, 1)), block_size=C4_BLOCK),
        compare=compare,
        strides={"kv": ("sliced",), "score": ("sliced",), "positions": ("sliced", "expanded"),
                           "norm_weight": ("sliced", "expanded"), "state_cache": ("sliced",),
                           # the state table and token_to_req not expanded: requests own disjoint state pages
                           # (docs/ops.md) and a token pools its own request's; a broadcast row or request
                           # makes tokens pool state rows another request wrote, or none did (poisoned)
                           "state_slot_mapping": ("sliced",), "state_block_table": ("sliced", "transposed"),
                           "token_to_req": ("sliced",), "slot_mapping": ("sliced",)},
        stride_bases={
            "quick": (dict(layout="fp8_ds_mla", ratio=4, reqs=((2, 7), (9, 1), (0, 4)), block_size=4, pad=1),),
            "full": (dict(layout="fp8_ds_mla", ratio=4, reqs=((0, 700), (513, 300)), decode=32, block_size=64, pad=3),),
        },
        error_base=dict(layout="fp8_ds_mla", ratio=4, reqs=((2, 6), (9, 1)), block_size=4),
        errors=ERRORS,
    ),
    bench=BenchShapes(
        cost=cost,
        tiny=dict(layout="fp8_ds_mla", ratio=4, reqs=((3, 1),), block_size=64),
        production=(
            dict(layout="fp8_ds_mla", ratio=4, reqs=((0, 8192),), block_size=64),
            dict(layout="fp8_ds_mla", ratio=128, reqs=((0, 8192),), block_size=2),
            dict(layout="index_fp8", ratio=4, reqs=((0, 8192),), block_size=64),
            dict(layout="nvfp4_v41", ratio=2, reqs=((0, 8192),), block_size=V41_BLOCK),
            dict(layout="nvfp4_v41", ratio=1, reqs=((0, 8192),), block_size=V41_BLOCK),
            dict(layout="index_mxfp4", ratio=1, reqs=((0, 4096),), block_size=V41_BLOCK),   # keys of ratio-2 groups
            dict(layout="nvfp4_v41", ratio=2, reqs=tuple((64 * i + i % 2, 5) for i in range(128)),
                 block_size=V41_BLOCK),                            # DSpark verify: 128 requests of 5 tokens
        ),
    ),
)
OP = define(SPEC)
