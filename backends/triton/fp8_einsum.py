"""Triton op 4: per-group FP8 GEMM ``d[b,h,:] = A[b,h,:] @ B[h]^T`` with 1x128 activation scales
and 128x128 weight scales applied per 128-wide K step (fp32 accumulation). ``a`` (batch and group
strides) and both scale tensors (all strides) are read through their strides."""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from dsv4ops.platform import platform

from .tuning import tuning


@triton.jit
def _fp8_einsum_kernel(a_ptr, sa_ptr, b_ptr, sb_ptr, d_ptr, Bn, D, R,
                       stride_ab, stride_ah, stride_sab, stride_sah, stride_sar,
                       stride_sbh, stride_sbn, stride_sbr, stride_db, stride_dh,
                       BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    h = tl.program_id(2).to(tl.int64)
    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    kk = tl.arange(0, 128)
    row_ok = rows < Bn
    a_rows = a_ptr + h * stride_ah + rows.to(tl.int64)[:, None] * stride_ab
    b_rows = b_ptr + (h * D + cols.to(tl.int64))[:, None] * R
    sa_rows = sa_ptr + h * stride_sah + rows.to(tl.int64) * stride_sab
    sb_rows = sb_ptr + h * stride_sbh + (cols // 128).to(tl.int64) * stride_sbn
    acc = tl.zeros((BLOCK_M, BLOCK_N), tl.float32)
    for kb in range(0, R // 128):
        a = tl.load(a_rows + kb * 128 + kk[None, :], mask=row_ok[:, None], other=0.0)
        b = tl.load(b_rows + kb * 128 + kk[None, :], mask=(cols < D)[:, None], other=0.0)
        sa = tl.load(sa_rows + kb * stride_sar, mask=row_ok, other=0.0)
        sb = tl.load(sb_rows + kb * stride_sbr, mask=cols < D, other=0.0)
        acc += tl.dot(a, tl.trans(b)) * sa[:, None] * sb[None, :]
    out = d_ptr + rows.to(tl.int64)[:, None] * stride_db + h * stride_dh + cols[None, :]
    tl.store(out, acc.to(d_ptr.dtype.element_ty), mask=row_ok[:, None] & (cols < D)[None, :])


def fp8_einsum(args):
    B, H, R = args.a.shape
    D = args.b.shape[1]
    out = torch.empty(B, H, D, dtype=args.out_dtype, device=args.a.device) if args.out is None else args.out
    if B == 0:
        return out
    tune = tuning(platform(args.a.device))
    BM, BN = tune.einsum_block_m, tune.einsum_block_n
    grid = (triton.cdiv(B, BM), triton.cdiv(D, BN), H)
    _fp8_einsum_kernel[grid](
        args.a, args.a_scale, args.b, args.b_scale, out, B, D, R, args.a.stride(0), args.a.stride(1),
        *args.a_scale.stride(), *args.b_scale.stride(), out.stride(0), out.stride(1),
        BLOCK_M=BM, BLOCK_N=BN, num_warps=tune.einsum_warps, num_stages=tune.einsum_stages,
    )
    return out
