"""Reference for op 2, docs/ops.md §2 "Exact math" (FMLA ref_sparse_attn_decode) in the token-flattened
form (one query token per row)."""
from __future__ import annotations

import torch

from dsv4ops import formats
from dsv4ops.workspace import selected_mask


def gather_selected(cache, layout, block_size, indices, lens, kv_scale):
    """Dequantized rows ``[T, topk, 512]`` fp32 for the selected entries, and their mask ``[T, topk]``.

    An entry is selected when its index is not -1 and its position is below the row's length.
    Unselected entries are zeroed (the rows they point at may hold NaN).
    """
    valid = selected_mask(indices, lens)
    safe = torch.where(valid, indices, torch.zeros_like(indices))
    rows = formats.read_kv(cache, layout, block_size, safe, kv_scale)
    return torch.where(valid[..., None], rows, torch.zeros((), device=rows.device)), valid


def sparse_mla_decode(a):
    o, lse = _attend(a, magnitude=False)
    result = o.to(torch.bfloat16).contiguous()
    if a.out is not None:
        result = a.out.copy_(result)
    return result, lse if a.need_lse else None


def output_magnitude(a) -> torch.Tensor:
    """fp32 [T, H, 512]: the output computed with every value's magnitude, sum_k p_k |v_k| (sink
    included). Rounding the probabilities or the values to bf16, as the kernels do before their
    P @ V product, moves an output by up to about 2^-8 of it (the conformance rule's extra bound
    where the output itself is small through cancellation)."""
    return _attend(a, magnitude=True)[0]


def _attend(a, magnitude: bool):
    """fp32 output [T, H, 512] and lse [T, H] (+inf for lonely tokens)."""
    keys, valid = gather_selected(a.kv_cache, a.layout, a.block_size, a.indices, a.topk_lens, a.kv_scale)
    if a.extra_kv_cache is not None:
        extra_keys, extra_valid = gather_selected(a.extra_kv_cache, a.extra_layout, a.extra_block_size, a.extra_indices,
                                                  a.extra_topk_lens, a.kv_scale)
        keys, valid = torch.cat([keys, extra_keys], 1), torch.cat([valid, extra_valid], 1)

    qf = a.q.to(torch.float32)
    if a.layout.has_tensor_scale:
        qf = qf * (a.q_scale.to(qf.device) if isinstance(a.q_scale, torch.Tensor) else a.q_scale)
    scores = torch.einsum("thd,tkd->thk", qf, keys) * a.softmax_scale       # duplicates count twice
    scores = scores.masked_fill(~valid[:, None, :], float("-inf"))
    lse = torch.logsumexp(scores, dim=-1)                                  # [T, H]; -inf when empty
    lonely = lse == float("-inf")
    probs = torch.exp(scores - torch.where(lonely, 0.0, lse)[..., None])
    o = torch.einsum("thk,tkd->thd", probs, keys.abs() if magnitude else keys)
    if a.attn_sink is not None:                                              # lse excludes the sink
        o = o * torch.sigmoid(lse - a.attn_sink.to(torch.float32)[None, :])[..., None]
    o = torch.where(lonely[..., None], 0.0, o)
    return o, torch.where(lonely, float("inf"), lse)
