"""Reference for op 4, spec §4 "Exact math": dequantize both operands, contract in float64."""
from __future__ import annotations

import torch

BLOCK = 128


def fp8_einsum(equation, a, a_scale, b, b_scale, *, out=None, out_dtype=torch.bfloat16):
    a_deq = a.to(torch.float64) * a_scale.to(torch.float64).repeat_interleave(BLOCK, dim=-1)
    b_scales = b_scale.to(torch.float64).repeat_interleave(BLOCK, dim=1).repeat_interleave(BLOCK, dim=2)
    b_deq = b.to(torch.float64) * b_scales
    result = torch.einsum("bhr,hdr->bhd", a_deq, b_deq).to(out_dtype).contiguous()
    return result if out is None else out.copy_(result)
