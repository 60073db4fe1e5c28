"""Random inputs per op, built from the spec (fresh per seed; never zeros).

Each builder takes a device, a ``torch.Generator`` (CPU) and the case parameters and returns the
op's keyword arguments. Poisons are part of the fixtures: cache rows no valid index selects hold NaN
(docs/ops.md §2), logits outside a row's range are +inf (a backend that ignores lengths picks them), and
cache bytes no slot owns are random (an insert that touches them is caught).
"""
from __future__ import annotations

import math

import torch

from .. import formats
from ..formats import Layout
from ..ops._rows import decode_row_ends
from ..quant import FP8_MAX, to_fp8, ue8m0_scale

SOFTMAX_SCALE = 512 ** -0.5
ROPE_THETA = 10000.0
FP8_NAN = {"ocp": 0x7F, "fnuz": 0x80}            # an e4m3 NaN byte


def _randn(gen, *shape):
    return torch.randn(*shape, generator=gen)


def _randint(gen, lo, hi, shape):
    return torch.randint(lo, hi, shape, generator=gen)


def cos_sin_cache(max_pos: int) -> torch.Tensor:
    """fp32 [max_pos, 64]: row p = [cos(p f_0..f_31) | sin(p f_0..f_31)], f_i = theta^(-2i/64)."""
    freqs = ROPE_THETA ** (-torch.arange(0, formats.ROPE_DIM, 2, dtype=torch.float64) / formats.ROPE_DIM)
    angles = torch.arange(max_pos, dtype=torch.float64)[:, None] * freqs[None, :]
    return torch.cat([angles.cos(), angles.sin()], dim=1).to(torch.float32)


def random_cache_bytes(gen, num_blocks: int, block_size: int, layout: str) -> torch.Tensor:
    """A cache in ``layout`` filled with random bytes (finite values for float layouts)."""
    shape, dtype = formats.kv_cache_spec(num_blocks, block_size, layout)
    if dtype == torch.uint8:
        return _randint(gen, 0, 256, shape).to(torch.uint8)
    return (_randn(gen, *shape) * 4).to(dtype)


# ---------------------------------------------------------------------------------------------
def qnorm_rope_kv_insert(device, gen, *, T, H, layout, block_size=64, num_blocks=4, skip_slots=0.25,
                         dp_pad=0, max_pos=4096, out=False):
    q = (_randn(gen, T, H, 512) * (0.5 + 4 * torch.rand(T, H, 1, generator=gen))).to(torch.bfloat16)
    kv = (_randn(gen, T, 512) * (0.01 + 3 * torch.rand(T, 1, generator=gen))).to(torch.bfloat16)
    positions = _randint(gen, 0, max_pos, (T,))
    if T >= 2:                                  # both ends of the cos/sin cache
        positions[0], positions[-1] = 0, max_pos - 1
    n_kv = max(T - dp_pad, 0)
    num_slots = num_blocks * block_size
    slots = torch.randperm(num_slots, generator=gen)[:n_kv]
    if len(slots) < n_kv:
        raise ValueError("not enough cache slots for the tokens")
    slots = torch.where(torch.rand(n_kv, generator=gen) < skip_slots, torch.full_like(slots, -1), slots)
    scales = dict(kv_scale=0.5, q_scale=0.25) if Layout.of(layout).has_tensor_scale else {}
    out_dtype = Layout.of(layout).query_dtype
    kwargs = dict(q=q, kv=kv, positions=positions, cos_sin_cache=cos_sin_cache(max_pos),
                  kv_cache=random_cache_bytes(gen, num_blocks, block_size, layout), slot_mapping=slots,
                  layout=layout, block_size=block_size, eps=1e-6, **scales)
    if out:
        kwargs["out"] = torch.empty(T, H, 512, dtype=out_dtype)
    return _to(kwargs, device)


# ---------------------------------------------------------------------------------------------
def _index_lists(gen, T, topk, num_slots, lens_mode, corner):
    """indices int32 [T, topk] (distinct slots; -1 padding past the length), lens int32 [T] or None,
    and the set of selected slots."""
    if num_slots < topk:
        raise ValueError("not enough slots for topk")
    idx = torch.stack([torch.randperm(num_slots, generator=gen)[:topk] for _ in range(T)]) if T else \
        torch.empty(0, topk, dtype=torch.int64)
    if lens_mode == "full" or lens_mode is None:
        lens = torch.full((T,), topk)
    else:
        lens = _randint(gen, 0, topk + 1, (T,))
        if T:
            lens[0] = topk
    pos = torch.arange(topk)
    beyond = pos[None, :] >= lens[:, None]
    # Beyond the length: -1 in the vLLM style, except every other token points at (NaN) rows.
    pointing = torch.rand(T, generator=gen)[:, None] < 0.5
    idx = torch.where(beyond & ~pointing, -1, idx)
    if corner == "all_invalid":
        idx[:] = -1
    elif corner == "pad_middle":
        idx = torch.where((torch.rand(T, topk, generator=gen) < 0.3) & ~beyond, -1, idx)
    elif corner == "duplicates" and topk >= 2:
        idx[:, 1::2] = idx[:, 0::2][:, : idx[:, 1::2].shape[1]]
    elif corner == "zero_len":
        lens[::2] = 0
    selected = idx[(idx >= 0) & ~(pos[None, :] >= lens[:, None])] if lens_mode is not None else idx[idx >= 0]
    return idx.to(torch.int32), (lens.to(torch.int32) if lens_mode is not None else None), selected


def _filled_cache(gen, layout, block_size, num_slots, selected, kv_scale):
    # Row scales up to ~0.5 as in FlashMLA's tests: its abs tolerance (1e-3) budgets the bf16
    # rounding of the softmax weights, an error proportional to |V|.
    rows = _randn(gen, num_slots, 512) * (0.02 + 0.5 * torch.rand(num_slots, 1, generator=gen))
    unselected = torch.ones(num_slots, dtype=torch.bool)
    unselected[selected.to(torch.int64)] = False
    rows[unselected] = float("nan")
    return formats.pack_kv(rows, layout, block_size, kv_scale)


def sparse_mla_decode(device, gen, *, T, H, topk, layout, block_size=64, extra_topk=0, extra_block_size=64,
                      sink="random", lens="random", corner=None, out=False, need_lse=True, extra_slots=0):
    """Inputs of sparse_mla_decode and sparse_mla_prefill; ``extra_slots`` sizes the extra cache (at
    least twice extra_topk) to spread the selections, as a long context does."""
    per_tensor = Layout.of(layout).has_tensor_scale
    kv_scale = 0.25 if per_tensor else 1.0
    num_slots = max(2 * topk, 4 * block_size)
    num_slots += (-num_slots) % block_size
    idx, lens_t, selected = _index_lists(gen, T, topk, num_slots, lens, corner)
    qf = _randn(gen, T, H, 512)
    kwargs = dict(q=to_fp8(qf * 2) if per_tensor else qf.to(torch.bfloat16),
                  kv_cache=_filled_cache(gen, layout, block_size, num_slots, selected, kv_scale),
                  indices=idx, topk_lens=lens_t, layout=layout, block_size=block_size,
                  softmax_scale=SOFTMAX_SCALE)
    if per_tensor:
        kwargs.update(kv_scale=kv_scale, q_scale=0.5)
    if extra_topk:
        n_extra = max(2 * extra_topk, 4 * extra_block_size, extra_slots)
        n_extra += (-n_extra) % extra_block_size
        e_idx, e_lens, e_sel = _index_lists(gen, T, extra_topk, n_extra, lens, corner)
        kwargs.update(extra_kv_cache=_filled_cache(gen, layout, extra_block_size, n_extra, e_sel, kv_scale),
                      extra_indices=e_idx, extra_topk_lens=e_lens, extra_block_size=extra_block_size)
    if sink == "random":
        kwargs["attn_sink"] = _randn(gen, H) * 2
    elif sink == "inf":
        kwargs["attn_sink"] = torch.where(torch.arange(H) % 2 == 0, float("inf"), float("-inf"))
    if out:
        kwargs["out"] = torch.empty(T, H, 512, dtype=torch.bfloat16)
    if not need_lse:
        kwargs["need_lse"] = False
    return _to(kwargs, device)


# ---------------------------------------------------------------------------------------------
def paged_mqa_logits(device, gen, *, B, next_n, context, H=64, block_size=64, lens_dim=2, scale_fmt="fp32",
                     clean=False, corner=None, out=False):
    pages = max(1, math.ceil(context / block_size))
    num_blocks = B * pages + 3
    keys = _randn(gen, num_blocks, block_size, 128) * (0.05 + torch.rand(num_blocks, block_size, 1, generator=gen))
    kv_cache = formats.pack_index_keys(keys, scale_fmt)
    block_table = torch.randperm(num_blocks, generator=gen)[: B * pages].view(B, pages).to(torch.int32)
    lens = _randint(gen, 0, context + 1, (B,))
    if B:
        lens[0] = context
    if corner == "zero_len":
        lens[::2] = 0
    if corner == "short":                       # lengths shorter than next_n
        lens = _randint(gen, 0, next_n, (B,))
    if lens_dim == 2:
        j = torch.arange(next_n)
        lens = (lens[:, None] - next_n + j + 1).clamp_min(0)
    q = to_fp8(_randn(gen, B, next_n, H, 128) * 3)
    if corner == "padded_rows" and B > 1:       # vLLM pads MTP rows with zero Q, masked by lengths
        q[-1] = 0
    weights = _randn(gen, B * next_n, H) * 0.2
    kwargs = dict(q=q, kv_cache=kv_cache, weights=weights, context_lens=lens.to(torch.int32),
                  block_table=block_table, max_context_len=pages * block_size, clean=clean)
    if out:
        kwargs["out"] = torch.empty(B * next_n, pages * block_size)
    return _to(kwargs, device)


# ---------------------------------------------------------------------------------------------
def quantize_blocks(x: torch.Tensor, block_rows: int) -> tuple[torch.Tensor, torch.Tensor]:
    """fp32 ``[..., M, K]`` -> fp8 values and power-of-two fp32 scales per ``block_rows x 128`` block
    (``[..., ceil(M / block_rows), K / 128]``, or ``[..., M, K / 128]`` when ``block_rows == 1``)."""
    *lead, M, K = x.shape
    blocks = x.reshape(*lead, M // block_rows, block_rows, K // 128, 128)
    amax = blocks.abs().amax(dim=(-3, -1)).clamp_min(1e-4)
    scale = ue8m0_scale(amax)[0]
    values = to_fp8(blocks / scale[..., None, :, None]).reshape(*lead, M, K)
    return values, scale


def fp8_einsum(device, gen, *, B, H, D, R, group_major=False, out=False, out_dtype=torch.bfloat16):
    x = _randn(gen, B, H, R) * (0.1 + torch.rand(B, H, 1, generator=gen))
    w = _randn(gen, H, D, R) * 0.05
    if group_major:                            # vLLM's physical [G, T, K] transposed
        a8, sa = quantize_blocks(x.transpose(0, 1).contiguous(), 1)
        a8, sa = a8.transpose(0, 1), sa.transpose(0, 1)
    else:
        a8, sa = quantize_blocks(x, 1)
    b8, sb = quantize_blocks(w, 128)
    kwargs = dict(equation="bhr,hdr->bhd", a=a8, a_scale=sa, b=b8, b_scale=sb, out_dtype=out_dtype)
    if out:
        kwargs["out"] = torch.empty(B, H, D, dtype=out_dtype)
    return _to(kwargs, device)


# ---------------------------------------------------------------------------------------------
def indexer_topk(device, gen, *, R, W, k, mode="ranges", next_n=1, data="random", corner=None, out=False,
                 column_major=False):
    logits = _randn(gen, R, W)
    if data == "ties":
        logits = _randint(gen, 0, 6, (R, W)).to(torch.float32)
    elif data == "neg_inf":
        logits[torch.rand(R, W, generator=gen) < 0.5] = float("-inf")
    elif data == "heavy_tail":                  # log-normal: the top spans many binades
        logits = torch.exp(logits * 3)
    elif data == "bf16":                        # 8 significant bits: long runs of equal values
        logits = logits.to(torch.bfloat16).to(torch.float32)
    kwargs = dict(logits=logits, k=k)
    if mode == "ranges":
        starts = _randint(gen, 0, max(W // 4, 1), (R,))
        ends = starts + _randint(gen, 0, W + 1, (R,))
        ends = ends.clamp(max=W)
        if corner == "empty":
            ends[::2] = starts[::2]
        kwargs.update(row_starts=starts.to(torch.int32), row_ends=ends.to(torch.int32))
        starts_e, ends_e = starts, ends
    else:
        B = R // next_n
        lens = _randint(gen, 0, W + 1, (B,))
        if corner == "empty":
            lens[::2] = 0
        if mode == "decode2d":
            lens = (lens[:, None] - next_n + torch.arange(next_n) + 1).clamp_min(0)
        kwargs.update(seq_lens=lens.to(torch.int32), next_n=next_n)
        ends_e = decode_row_ends(lens, next_n)
        starts_e = torch.zeros_like(ends_e)
    cols = torch.arange(W)
    outside = (cols < starts_e[:, None]) | (cols >= ends_e[:, None])
    logits[outside] = float("inf")              # a backend that ignores the range picks these
    if column_major:                            # the op accepts any strides
        kwargs["logits"] = logits.t().contiguous().t()
    if out:
        kwargs["out"] = torch.empty(R, k, dtype=torch.int32)
    return _to(kwargs, device)


# ---------------------------------------------------------------------------------------------
def inv_rope_fp8_quant(device, gen, *, T, H, n_groups, max_pos=4096, head_stride=0, corner=None):
    """Attention outputs of V4 magnitude (|o| up to about 0.5, one scale per head); ``head_stride``
    > H makes ``o`` a head slice of a wider buffer; ``corner="zero_head"`` zeroes one head (amax floor)."""
    width = max(head_stride, H)
    o = _randn(gen, T, width, 512) * (0.01 + 0.2 * torch.rand(T, width, 1, generator=gen))
    if corner == "zero_head" and T:
        o[:, 0] = 0.0
    positions = _randint(gen, 0, max_pos, (T,))
    if T >= 2:
        positions[0], positions[-1] = 0, max_pos - 1
    kwargs = dict(o=o.to(torch.bfloat16)[:, :H], positions=positions, cos_sin_cache=cos_sin_cache(max_pos),
                  n_groups=n_groups)
    return _to(kwargs, device)


# ---------------------------------------------------------------------------------------------
def key_ranges(gen, T: int, S: int, ranges: str) -> tuple[torch.Tensor, torch.Tensor]:
    """int64 ``ks``, ``ke`` [T] of mqa_logits: ``causal`` (one request, row t sees ``(t + 1) * S // T``
    keys, the V4 compressed-prefix rule with ratio T / S), ``requests`` (four requests, each with its
    own contiguous key segment and the causal rule inside it) or ``random``."""
    t = torch.arange(T)
    if ranges == "causal":
        return torch.zeros(T, dtype=torch.int64), (t + 1) * S // T
    if ranges == "requests":
        n = min(4, T) or 1
        q_bounds = torch.arange(n + 1) * T // n                 # query rows of request r: [q_bounds[r], q_bounds[r+1])
        k_bounds = torch.arange(n + 1) * S // n
        req = torch.bucketize(t, q_bounds[1:], right=True)
        rows, keys = q_bounds[req + 1] - q_bounds[req], k_bounds[req + 1] - k_bounds[req]
        return k_bounds[req], k_bounds[req] + (t - q_bounds[req] + 1) * keys // rows
    ks = _randint(gen, 0, S + 1, (T,))
    return ks, ks + (torch.rand(T, generator=gen) * (S - ks + 1)).floor().long().clamp(max=S - ks)


def mqa_logits(device, gen, *, T, S, H=64, ranges="causal", scale_fmt="fp32", flavour="ocp", clean=False,
               corner=None, out=False, topk=None):
    """``topk`` is read by the comparison rule only: it also feeds the logits to indexer_topk (ranges
    mode) and judges the pair end to end. Keys and scales no row's range covers are NaN (a kernel
    may read them only for columns it does not return)."""
    q = to_fp8(_randn(gen, T, H, 128) * 3, flavour)
    keys = _randn(gen, S, 128) * (0.05 + torch.rand(S, 1, generator=gen))
    amax = keys.abs().amax(-1).clamp_min(formats.AMAX_FLOOR)
    scale = amax / FP8_MAX[flavour] if scale_fmt == "fp32" else ue8m0_scale(amax, flavour)[0]
    k = to_fp8(keys / scale[:, None], flavour)
    ks, ke = key_ranges(gen, T, S, ranges)
    if corner == "empty":                       # ks == ke rows, at several offsets
        ke[::2] = ks[::2]
    elif corner == "full":
        ks[:], ke[:] = 0, S
    covered = torch.zeros(S + 1, dtype=torch.int64).index_add_(0, ks, torch.ones(T, dtype=torch.int64))
    covered = (covered.index_add_(0, ke, -torch.ones(T, dtype=torch.int64)).cumsum(0) > 0)[:S]
    k.view(torch.uint8)[~covered] = FP8_NAN[flavour]
    scale[~covered] = float("nan")
    kwargs = dict(q=q, k=k, k_scale=scale, weights=_randn(gen, T, H) * 0.2, ks=ks.to(torch.int32),
                  ke=ke.to(torch.int32), clean=clean)
    if out:
        kwargs["out"] = torch.empty(T, S)
    return _to(kwargs, device)


# ---------------------------------------------------------------------------------------------
def compress_kv_insert(device, gen, *, layout, ratio, block_size, reqs=(), decode=0, pad=0, dp_pad=0,
                       dtype=torch.float32, skip_slot=False):
    """Requests ``reqs = ((prior, new), ...)``: ``prior`` tokens compressed by earlier calls (their
    last window's state rows are random values, every other state row is NaN: nothing may read it),
    ``new`` tokens in this call. ``kv`` / ``score`` are the halves of one [T, 2c*D] projection
    (strided rows). ``pad`` dummy tokens (state slot -1) follow, then ``dp_pad`` tokens past the
    slot mappings. Tokens that close no window carry slots on a spare page (writing them is a bug);
    ``skip_slot`` gives the first closing token slot -1. ``decode=N`` adds N requests of one token
    each, every other one closing a window."""
    from ..ops.compress_kv_insert import overlap
    reqs = tuple(reqs) + tuple((ratio * (8 + i) - 1 - i % 2, 1) for i in range(decode))
    c, D = overlap(ratio), Layout.of(layout, among=formats.COMPRESSED_LAYOUTS).head_dim
    width, sbs = c * D, 4 if ratio == 4 else 8
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
            state[state_table[r, q // sbs], q % sbs] = torch.cat([_randn(gen, width), 2 * _randn(gen, width)])
        for q in range(prior, prior + new):
            positions.append(q)
            req_of.append(r)
            sslots.append(int(state_table[r, q // sbs]) * sbs + q % sbs)
            e = q // ratio
            slots.append(int(entry_table[r, e // block_size]) * block_size + e % block_size
                         if (q + 1) % ratio == 0 else spare * block_size + int(_randint(gen, 0, block_size, ())))
    if skip_slot:
        first = next(i for i, q in enumerate(positions) if (q + 1) % ratio == 0)
        slots[first] = -1
    max_pos = max(ends + [1]) + ratio
    for _ in range(pad):
        positions.append(int(_randint(gen, 0, max_pos, ())))
        req_of.append(0)
        sslots.append(-1)
        slots.append(spare * block_size)
    n = len(positions)
    positions += [int(_randint(gen, 0, max_pos, ())) for _ in range(dp_pad)]
    T = len(positions)
    proj = _randn(gen, T, 2 * width) * torch.cat([0.05 + 2 * torch.rand(T, 1, generator=gen),
                                                   torch.full((T, 1), 2.0)], dim=1).repeat_interleave(width, 1)
    shape = Layout.of(layout, among=formats.COMPRESSED_LAYOUTS).cache_shape(nb, block_size)
    cache = _randint(gen, 0, 256, shape).to(torch.uint8)          # random bytes: a stray write shows
    proj = proj.to(dtype)
    kwargs = dict(kv=proj[:, :width], score=proj[:, width:], positions=torch.tensor(positions, dtype=torch.int64),
                  ape=0.5 * _randn(gen, ratio, width), norm_weight=(1 + 0.1 * _randn(gen, D)).to(dtype),
                  cos_sin_cache=cos_sin_cache(max_pos), state_cache=state,
                  state_slot_mapping=torch.tensor(sslots, dtype=torch.int64), state_block_table=state_table,
                  token_to_req=torch.tensor(req_of, dtype=torch.int32), kv_cache=cache,
                  slot_mapping=torch.tensor(slots, dtype=torch.int64), layout=layout, ratio=ratio,
                  block_size=block_size, eps=1e-6)
    assert len(sslots) == n
    return _to(kwargs, device)


def _to(kwargs: dict, device) -> dict:
    return {k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in kwargs.items()}


BUILDERS = {
    "qnorm_rope_kv_insert": qnorm_rope_kv_insert,
    "sparse_mla_decode": sparse_mla_decode,
    "sparse_mla_prefill": sparse_mla_decode,
    "paged_mqa_logits": paged_mqa_logits,
    "fp8_einsum": fp8_einsum,
    "indexer_topk": indexer_topk,
    "mqa_logits": mqa_logits,
    "inv_rope_fp8_quant": inv_rope_fp8_quant,
    "compress_kv_insert": compress_kv_insert,
}
