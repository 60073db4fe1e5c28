"""Building blocks of the ops' sample inputs and error inputs (each op's declaration builds its
conformance inputs from these; fresh random values per generator, never zeros).

Poisons are part of the fixtures: cache rows no valid index selects hold NaN (docs/ops.md §2), and
cache bytes no slot owns are random (an insert that touches them is caught).
"""
from __future__ import annotations

from typing import Callable

import torch

from . import formats
from .quant import encode_mxfp4, to_fp8, ue8m0_scale
from .rows import causal_row_lengths, decode_row_ends

SOFTMAX_SCALE = 512 ** -0.5
ROPE_THETA = 10000.0
FP8_NAN = {"ocp": 0x7F, "fnuz": 0x80}            # an e4m3 NaN byte


def randn(gen, *shape):
    return torch.randn(*shape, generator=gen)


def randint(gen, lo, hi, shape):
    return torch.randint(lo, hi, shape, generator=gen)


def to_device(kwargs: dict, device) -> dict:
    """``kwargs`` with every tensor moved to ``device``."""
    return {k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in kwargs.items()}


def cos_sin_cache(max_pos: int, theta: float = ROPE_THETA) -> torch.Tensor:
    """fp32 [max_pos, 64]: row p = [cos(p f_0..f_31) | sin(p f_0..f_31)], f_i = theta^(-2i/64)."""
    freqs = theta ** (-torch.arange(0, formats.ROPE_DIM, 2, dtype=torch.float64) / formats.ROPE_DIM)
    angles = torch.arange(max_pos, dtype=torch.float64)[:, None] * freqs[None, :]
    return torch.cat([angles.cos(), angles.sin()], dim=1).to(torch.float32)


def random_cache_bytes(gen, num_blocks: int, block_size: int, layout: str,
                       page_bytes: int | None = None) -> torch.Tensor:
    """A cache in ``layout`` filled with random bytes (finite values for float layouts)."""
    shape, dtype = formats.kv_cache_spec(num_blocks, block_size, layout, page_bytes)
    if dtype == torch.uint8:
        return randint(gen, 0, 256, shape).to(torch.uint8)
    return (randn(gen, *shape) * 4).to(dtype)


def index_lists(gen, T, topk, num_slots, lens_mode, corner):
    """indices int32 [T, topk] (distinct slots; -1 padding past the length), lens int32 [T] or None,
    and the set of selected slots."""
    if num_slots < topk:
        raise ValueError("not enough slots for topk")
    idx = torch.stack([torch.randperm(num_slots, generator=gen)[:topk] for _ in range(T)]) if T else \
        torch.empty(0, topk, dtype=torch.int64)
    if lens_mode == "full" or lens_mode is None:
        lens = torch.full((T,), topk)
    else:
        lens = randint(gen, 0, topk + 1, (T,))
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


def index_query(x: torch.Tensor, fmt: str, flavour: str = "ocp") -> tuple[torch.Tensor, torch.Tensor | None]:
    """fp32 indexer queries ``[..., 128]`` -> ``(q, q_scale)``: e4m3 and None (``fmt="fp8"``), or MXFP4
    (``"mxfp4"``): packed e2m1 uint8 ``[..., 64]`` and UE8M0 bytes uint8 ``[..., 4]`` (quant.encode_mxfp4)."""
    if fmt == "fp8":
        return to_fp8(x, flavour), None
    packed, scales = encode_mxfp4(x.reshape(-1, formats.INDEX_DIM))
    return packed.view(*x.shape[:-1], -1), scales.view(*x.shape[:-1], -1)


def filled_cache(gen, layout, block_size, num_slots, selected, kv_scale, page_bytes=None):
    # Row scales up to ~0.5 as in FlashMLA's tests: its abs tolerance (1e-3) budgets the bf16
    # rounding of the softmax weights, an error proportional to |V|.
    rows = randn(gen, num_slots, 512) * (0.02 + 0.5 * torch.rand(num_slots, 1, generator=gen))
    unselected = torch.ones(num_slots, dtype=torch.bool)
    unselected[selected.to(torch.int64)] = False
    rows[unselected] = float("nan")
    return formats.pack_kv(rows, layout, block_size, kv_scale, page_bytes)


def quantize_blocks(x: torch.Tensor, block_rows: int, width: int = 128) -> tuple[torch.Tensor, torch.Tensor]:
    """fp32 ``[..., M, K]`` -> fp8 values and power-of-two fp32 scales per ``block_rows x width`` block
    (``[..., M / block_rows, K / width]``, or ``[..., M, K / width]`` when ``block_rows == 1``)."""
    *lead, M, K = x.shape
    blocks = x.reshape(*lead, M // block_rows, block_rows, K // width, width)
    amax = blocks.abs().amax(dim=(-3, -1)).clamp_min(1e-4)
    scale = ue8m0_scale(amax)[0]
    values = to_fp8(blocks / scale[..., None, :, None]).reshape(*lead, M, K)
    return values, scale


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
    ks = randint(gen, 0, S + 1, (T,))
    return ks, ks + (torch.rand(T, generator=gen) * (S - ks + 1)).floor().long().clamp(max=S - ks)


# ---------------------------------------------------------------------------------------------
# Error inputs: ``(argument, change)`` pairs; ``change(kwargs)`` edits a valid call in place so that
# the named argument is wrong.

def request_lengths(gen, B: int, width: int, zeros: str | None = None) -> torch.Tensor:
    """int64 ``[B]`` context lengths in ``[0, width]``, the first request's ``width``; ``zeros``:
    "every_other" or "all" of them 0."""
    lens = randint(gen, 0, width + 1, (B,))
    if B:
        lens[0] = width
    if zeros == "every_other":
        lens[::2] = 0
    elif zeros == "all":
        lens[:] = 0
    return lens


def row_ranges(gen, R: int, W: int, mode: str, next_n: int = 1, corner: str | None = None) -> tuple[dict, torch.Tensor]:
    """How rows of width ``W`` over logits ``[R, W]`` get their columns (indexer_topk's modes):
    "ranges" (``row_starts``/``row_ends``), "decode1d" / "decode2d" (``seq_lens`` per request or per
    row, ``next_n``; the first request spans the whole width). ``corner``: "empty" (every other
    row or request empty), "all_empty". Returns the op's arguments and a bool [R, W] mask of the
    columns outside every row's range."""
    if mode == "ranges":
        starts = randint(gen, 0, max(W // 4, 1), (R,))
        ends = (starts + randint(gen, 0, W + 1, (R,))).clamp(max=W)
        if corner == "empty":
            ends[::2] = starts[::2]
        elif corner == "all_empty":
            ends = starts.clone()
        args = dict(row_starts=starts.to(torch.int32), row_ends=ends.to(torch.int32))
    else:
        lens = request_lengths(gen, R // next_n, W, {"empty": "every_other", "all_empty": "all"}.get(corner))
        if mode == "decode2d":
            lens = causal_row_lengths(lens, next_n)
        args = dict(seq_lens=lens.to(torch.int32), next_n=next_n)
        ends = decode_row_ends(lens, next_n)
        starts = torch.zeros_like(ends)
    cols = torch.arange(W)
    return args, (cols < starts[:, None]) | (cols >= ends[:, None])


def random_blocks(gen, lens: torch.Tensor, num_blocks: int, sparse_block: int, newest=True) -> torch.Tensor:
    """Candidate blocks (docs/ops.md §15), int32 [R, num_blocks]: per row min(num_blocks, ceil(n / sparse_block)) random visible blocks,
    the newest one among them (unless ``newest=False``), ascending, then -1."""
    out = torch.full((lens.numel(), num_blocks), -1, dtype=torch.int32)
    for r, n in enumerate(lens.tolist()):
        total = -(-n // sparse_block)
        m = min(num_blocks, total)
        if m == 0:
            continue
        pick = torch.randperm(total - 1, generator=gen)[: m - 1] if newest else torch.randperm(total, generator=gen)[:m]
        chosen = torch.cat([pick, torch.tensor([total - 1])]) if newest else pick
        out[r, :m] = chosen.sort().values.to(torch.int32)
    return out


def set_args(**changes) -> Callable[[dict], None]:
    """An error input's change: set these arguments."""
    return lambda kwargs: kwargs.update(changes)


def change(name: str, fn: Callable) -> Callable[[dict], None]:
    """An error input's change: replace argument ``name`` by ``fn(kwargs[name])``."""
    return lambda kwargs: kwargs.update({name: fn(kwargs[name])})
