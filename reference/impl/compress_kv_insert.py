"""Reference for docs/ops.md §9: save the state rows, then pool each completed window in fp32
(softmax over the window per channel), RMSNorm, RoPE, bf16, and write the quantized entry."""
from __future__ import annotations

import torch

from dsv4ops import formats
from dsv4ops.quant import to_fp8, ue8m0_scale

from .rope import cos_sin, rotate


def compress_kv_insert(a):
    n = a.state_slot_mapping.shape[0]
    c, ratio, width = formats.window_overlap(a.ratio), a.ratio, a.kv.shape[1]
    D = width // c
    pos = a.positions[:n]
    sbs = a.state_cache.shape[1]

    # 1. the state row of every live token: [kv, score + ape[p % ratio]] in fp32
    live = a.state_slot_mapping >= 0
    state = torch.cat([a.kv[:n].float(), a.score[:n].float() + a.ape[pos % ratio]], dim=1)
    s = a.state_slot_mapping[live]
    a.state_cache[s // sbs, s % sbs] = state[live]

    # 2. one entry per live token that closes a window and has a slot
    done = live & ((pos + 1) % ratio == 0) & (a.slot_mapping >= 0)
    if not bool(done.any()):
        return None
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
    pooled = (kv * score.softmax(dim=1)).sum(dim=1)          # [N, D]
    normed = pooled * torch.rsqrt(pooled.square().mean(-1, keepdim=True) + a.eps) * a.norm_weight.float()
    cos, sin = cos_sin(a.cos_sin_cache, p - ratio + 1)      # RoPE at the window's first position
    entry = rotate(normed, cos, sin).to(torch.bfloat16).float()
    if a.layout.is_paged_bytes:
        formats.write_kv(a.kv_cache, a.layout, a.block_size, a.slot_mapping[done], entry)
    else:
        _write_index_keys(a.kv_cache, a.slot_mapping[done], entry)
    return None


def _write_index_keys(cache: torch.Tensor, slots: torch.Tensor, keys: torch.Tensor) -> None:
    """Keys fp32 [N, 128] at ``slots`` of an index key cache (docs/ops.md §6.4, ``"ue8m0"`` scales)."""
    nb, bs = cache.shape[0], cache.shape[1]
    scale = ue8m0_scale(keys.abs().amax(-1).clamp_min(formats.AMAX_FLOOR))[0]
    values = to_fp8(keys / scale[:, None]).view(torch.uint8)
    page = cache.view(nb, bs * formats.INDEX_TOKEN_BYTES)
    block, off = slots // bs, slots % bs
    cols = off[:, None] * formats.INDEX_DIM + torch.arange(formats.INDEX_DIM, device=cache.device)
    page[block[:, None], cols] = values
    cols = bs * formats.INDEX_DIM + off[:, None] * 4 + torch.arange(4, device=cache.device)
    page[block[:, None], cols] = scale.contiguous().view(torch.uint8).view(-1, 4)
