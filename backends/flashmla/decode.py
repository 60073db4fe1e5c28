"""dsv4ops sparse_mla_decode -> flash_mla.flash_mla_with_kvcache (MODEL1 sparse decode).

The adapter pads heads to 64/128 (no copy when H already is), views each cache as the
``[num_blocks, block_size, 1, token_bytes]`` tensor FlashMLA expects (584 B fp8_ds_mla, 528 B
mxfp8_v41*, 288 B nvfp4_v41*; FlashMLA picks the record from the last dimension; the page pitch,
``kv_cache.stride(0)``, is kept, so padded and unpadded pages both pass), adds the s_q = 1
axis, and builds a fresh scheduler object per call (FlashMLA may reuse one only while shapes and
length tensors are unchanged)."""
from __future__ import annotations

import torch

from dsv4ops.backend_support import decode_output, dense, pad_heads


def padded_heads(H: int) -> int:
    return 64 if H <= 64 else 128


def cache_view(cache: torch.Tensor, block_size: int, layout) -> torch.Tensor:
    """uint8 [num_blocks, page_bytes] -> [num_blocks, block_size, 1, layout.token_bytes] over the same
    bytes (stride(0) kept)."""
    row = layout.token_bytes
    return cache[:, : block_size * row].view(cache.shape[0], block_size, 1, row)


def sparse_mla_decode(a):
    import flash_mla

    T, H, _ = a.q.shape
    if T == 0:
        return decode_output(a.q, a.out), torch.empty(0, H, dtype=torch.float32, device=a.q.device) if a.need_lse else None
    Hp = padded_heads(H)
    q_p, sink_p = pad_heads(a.q, a.attn_sink, Hp)
    extra = {}
    if a.extra_kv_cache is not None:
        extra = dict(extra_k_cache=cache_view(a.extra_kv_cache, a.extra_block_size, a.extra_layout),
                     extra_indices_in_kvcache=dense(a.extra_indices).unsqueeze(1),
                     extra_topk_length=dense(a.extra_topk_lens))
    sched, _ = flash_mla.get_mla_metadata()
    o, lse = flash_mla.flash_mla_with_kvcache(
        q_p.unsqueeze(1), cache_view(a.kv_cache, a.block_size, a.layout), None, None, head_dim_v=512,
        tile_scheduler_metadata=sched, num_splits=None, softmax_scale=a.softmax_scale, causal=False,
        is_fp8_kvcache=True, indices=dense(a.indices).unsqueeze(1), attn_sink=sink_p, topk_length=dense(a.topk_lens),
        **extra)
    o = o[:, 0, :H]
    lse = lse[:, :H, 0].contiguous() if a.need_lse else None
    if a.out is None:
        return o.contiguous() if Hp != H else o, lse
    a.out.copy_(o)
    return a.out, lse
