"""Reference for op 4, docs/ops.md §4 "Exact math": dequantize both operands, contract in float64."""
from __future__ import annotations

import torch

from dsv4ops.quant import scale_block


def fp8_einsum(args):
    _, D, R = args.b.shape
    w = scale_block(D, R, args.b_scale.shape[1:])
    a_deq = args.a.to(torch.float64) * args.a_scale.to(torch.float64).repeat_interleave(w, dim=-1)
    b_scales = args.b_scale.to(torch.float64).repeat_interleave(w, dim=1).repeat_interleave(w, dim=2)
    b_deq = args.b.to(torch.float64) * b_scales
    result = torch.einsum("bhr,hdr->bhd", a_deq, b_deq).to(args.out_dtype).contiguous()
    return result if args.out is None else args.out.copy_(result)
