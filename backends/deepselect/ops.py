"""dsv4ops indexer_topk (decode form) -> ``deep_select.topk(input, topk, end=..., indices_type=torch.int32,
output_idx=..., idx_oob_fill_value=-1, return_value=False, abort_when_nan_found=False)``.

With ``begin`` absent DeepSelect returns row-local columns, and rows with ``end <= topk`` come back as
``0 .. end-1`` then the fill value: the dsv4ops contract with ``idx_oob_fill_value=-1``.

The logits are copied into rows padded to DeepSelect's input stride (``get_stride_requirement()[0]``
bytes, 1024 in 1.0.0). The copy also maps ``-inf`` and NaN to the lowest finite fp32: DeepSelect
pads with ``-inf`` placeholders, so a row longer than its 8192-element first window with fewer than
``k`` values above ``-inf`` could return padding positions, where docs/ops.md §5 makes ``-inf`` an
ordinary candidate; and a NaN would trap the kernel (or, with ``abort_when_nan_found=False``, leave
the row unwritten). So a NaN inside a row ranks as the lowest value (NaN is unspecified in §5). A
true ``-3.4e38`` logit ties with a mapped ``-inf`` (either may be taken). Cost: one extra
read + write of the logits per call.
"""
from __future__ import annotations

import torch

from dsv4ops.backend_support import topk_output
from dsv4ops.rows import decode_row_ends

_LOWEST = torch.finfo(torch.float32).min


def _aligned_copy(logits: torch.Tensor, stride_bytes: int) -> torch.Tensor:
    """fp32 [R, W] copy with rows padded to ``stride_bytes``; -inf and NaN become the lowest finite."""
    R, W = logits.shape
    per = stride_bytes // logits.element_size()
    buf = torch.empty(R, (W + per - 1) // per * per, dtype=torch.float32, device=logits.device)[:, :W]
    return torch.nan_to_num(logits, nan=_LOWEST, posinf=float("inf"), neginf=_LOWEST, out=buf)


def indexer_topk(a):
    import deep_select

    R, W = a.logits.shape
    result = topk_output(a)
    k = min(a.k, W)
    if R == 0 or k == 0:
        return result.fill_(-1)
    in_stride, out_stride = deep_select.get_stride_requirement()
    ends = decode_row_ends(a.seq_lens, a.next_n).to(torch.int32)
    direct = k == a.k and result.stride(0) * result.element_size() % out_stride == 0
    _, idx = deep_select.topk(_aligned_copy(a.logits, in_stride), k, end=ends, indices_type=torch.int32,
                              output_idx=result if direct else None, idx_oob_fill_value=-1,
                              return_value=False, abort_when_nan_found=False)
    if not direct:
        result[:, :k].copy_(idx)
        result[:, k:].fill_(-1)
    return result
