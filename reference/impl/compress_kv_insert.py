"""Reference for docs/ops.md §9: save the state rows, then pool each completed window in fp32
(softmax over the window per channel; ratio 1: the token's own row), RMSNorm, RoPE, bf16, and write
the quantized entry."""
from __future__ import annotations

import torch

from dsv4ops import formats
from dsv4ops.formats import Layout
from dsv4ops.quant import encode_mxfp4, to_fp8, ue8m0_scale

from .rope import cos_sin, rotate


def compress_kv_insert(a):
    if a.ratio != 1:
        _save_state(a)
    done, normed, entry = entry_rows(a)
    if not bool(done.any()):
        return None
    if a.latent is not None:
        a.latent[done] = normed.to(torch.bfloat16)
    if a.layout.is_paged_bytes:
        formats.write_kv(a.kv_cache, a.layout, a.block_size, a.slot_mapping[done], entry)
    else:
        _write_index_keys(a.kv_cache, a.layout, a.slot_mapping[done], entry)
    return None


def entry_rows(a):
    """The tokens that write an entry (bool ``[T']``), their normalized rows (fp32 ``[N, D]``, the
    latent) and the entries the writer quantizes (fp32 ``[N, D]``, bf16 values). Reads the state rows
    the call saves (step 1), so it may run again on the inputs after the call."""
    ratio = a.ratio
    if ratio == 1:                                           # no state: every token with a slot is an entry
        done = a.slot_mapping >= 0
        p, pooled = a.positions[:done.shape[0]][done], a.kv[:done.shape[0]][done].float()
    else:
        done, p, pooled = _pool(a)
    normed = pooled * torch.rsqrt(pooled.square().mean(-1, keepdim=True) + a.eps) * a.norm_weight.float()
    if ratio in formats.V41_COMPRESSION_RATIOS:              # V4.1 keeps the bf16 latent, then ropes it
        normed = normed.to(torch.bfloat16).float()
    cos, sin = cos_sin(a.cos_sin_cache, p - ratio + 1)      # RoPE at the window's first position
    return done, normed, rotate(normed, cos, sin).to(torch.bfloat16).float()


def _save_state(a):
    """Step 1: the state row of every live token, [kv, score (+ ape[p % ratio])] in fp32."""
    n = a.state_slot_mapping.shape[0]
    pos = a.positions[:n]
    sbs = a.state_cache.shape[1]
    live = a.state_slot_mapping >= 0
    score = a.score[:n].float()
    if a.ape is not None:
        score = score + a.ape[pos % a.ratio]
    s = a.state_slot_mapping[live]
    a.state_cache[s // sbs, s % sbs] = torch.cat([a.kv[:n].float(), score], dim=1)[live]


def _pool(a):
    """Step 2, from the saved state rows: the tokens that close a window and have a slot (bool
    ``[T']``), their positions ``[N]`` and the windows' pooled fp32 rows ``[N, D]``."""
    n = a.state_slot_mapping.shape[0]
    c, ratio, width = formats.window_overlap(a.ratio), a.ratio, a.kv.shape[1]
    D = width // c
    pos = a.positions[:n]
    sbs = a.state_cache.shape[1]
    live = a.state_slot_mapping >= 0
    done = live & ((pos + 1) % ratio == 0) & (a.slot_mapping >= 0)
    p, req = pos[done], a.token_to_req[done].long()
    j = torch.arange(c * ratio, device=p.device)
    w = p[:, None] - c * ratio + 1 + j                       # window positions [N, c*ratio]
    valid = (w >= 0)[..., None]
    wc = w.clamp_min(0)
    window = a.state_cache[a.state_block_table[req[:, None], wc // sbs].long(), wc % sbs]   # [N, c*ratio, 2*c*D]
    first = (j >= ratio).long() * D if c == 2 else torch.zeros_like(j)   # C4: the earlier ratio tokens use [0, D)
    cols = (first[:, None] + torch.arange(D, device=p.device)).expand(len(p), -1, -1)
    kv = torch.where(valid, torch.gather(window, 2, cols), 0.0)
    score = torch.where(valid, torch.gather(window, 2, cols + width), float("-inf"))
    return done, p, (kv * score.softmax(dim=1)).sum(dim=1)


def _write_index_keys(cache: torch.Tensor, layout: Layout, slots: torch.Tensor, keys: torch.Tensor) -> None:
    """Keys fp32 [N, 128] at ``slots`` of an indexer key cache: ``index_fp8`` (docs/ops.md §6.4,
    ``"ue8m0"`` scales) or ``index_mxfp4`` (§6.4.1)."""
    if layout.kind == Layout.INDEX_MXFP4:
        values, scales = encode_mxfp4(keys)
    else:
        scale = ue8m0_scale(keys.abs().amax(-1).clamp_min(formats.AMAX_FLOOR))[0]
        values = to_fp8(keys / scale[:, None]).view(torch.uint8)
        scales = scale.contiguous().view(torch.uint8).view(-1, 4)
    nb, bs = cache.shape[0], cache.shape[1]
    page = cache.view(nb, bs * layout.token_bytes)
    block, off = slots // bs, slots % bs
    ar = lambda k: torch.arange(k, device=cache.device)
    page[block[:, None], off[:, None] * layout.data_bytes + ar(layout.data_bytes)] = values
    page[block[:, None], bs * layout.data_bytes + off[:, None] * layout.scale_bytes + ar(layout.scale_bytes)] = scales
