"""Triton op 4: per-group FP8 GEMM ``d[b,h,:] = A[b,h,:] @ B[h]^T`` with 1 x w activation scales and
w x w weight scales (w = 128, or V4.1's 32) applied per w-wide K step (fp32 accumulation). ``a`` (batch
and group strides) and both scale tensors (all strides) are read through their strides.

With ``einsum_tma`` the fp8 tiles are loaded through host-built tensor descriptors (TMA on Hopper)
when the operands' addresses and strides allow it, pointer loads otherwise. The software fp8 path
first decodes both operands' bytes once per call (``e4m3_decode``) to fp16 holding value * 2**-8
(exact) in a workspace of 2 bytes per element of ``a`` and ``b`` (2 * (B*H*R + H*D*R) bytes, freed on
return), so no tile is decoded once per program that reads it; it then runs fp16 dots through pointer
loads and scales the accumulator by 2**16 at the end."""
from __future__ import annotations

import torch
import triton
import triton.language as tl
from triton.tools.tensor_descriptor import TensorDescriptor

from dsv4ops.quant import scale_block

from .common import e4m3_decode
from .tuning import Target


@triton.jit
def _operands(a_src, b_src, sa_rows, sb_base, a_rows, b_rows, row_ok, col_ok, cols, h, m0, n0, kb, stride_sar,
              stride_sbn, stride_sbr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
              TMA: tl.constexpr):
    """K step ``kb``: the tiles a [BLOCK_M, BLOCK_K] and b [BLOCK_N, BLOCK_K] (fp8, or with FP8_SOFT the
    decoded fp16 * 2**-8), the row scales [BLOCK_M] and the column scales: [BLOCK_N], or one scalar
    when BLOCK_N <= BLOCK_K (one weight block)."""
    if TMA:
        a = a_src.load([h, m0, kb * BLOCK_K]).reshape(BLOCK_M, BLOCK_K)
        b = b_src.load([h, n0, kb * BLOCK_K]).reshape(BLOCK_N, BLOCK_K)
    else:
        kk = tl.arange(0, BLOCK_K)
        a = tl.load(a_rows + kb * BLOCK_K + kk[None, :], mask=row_ok[:, None], other=0.0)
        b = tl.load(b_rows + kb * BLOCK_K + kk[None, :], mask=col_ok[:, None], other=0.0)
    sa = tl.load(sa_rows + kb * stride_sar, mask=row_ok, other=0.0)
    if BLOCK_N <= BLOCK_K:
        sb = tl.load(sb_base + (n0 // BLOCK_K) * stride_sbn + kb * stride_sbr)
    else:
        sb = tl.load(sb_base + (cols // BLOCK_K).to(tl.int64) * stride_sbn + kb * stride_sbr, mask=col_ok, other=0.0)
    return a, b, sa, sb


@triton.jit
def _scaled(p, sa, sb, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    """``p`` [BLOCK_M, BLOCK_N] times its row and column scales (one multiply per element when the
    column scale is one scalar)."""
    if BLOCK_N <= BLOCK_K:
        scaled = p * (sa * sb)[:, None]
    else:
        scaled = p * sa[:, None] * sb[None, :]
    return scaled


@triton.jit(do_not_specialize=["Bn", "stride_ab", "stride_ah", "stride_sab", "stride_sah"])
def _fp8_einsum_kernel(a_src, sa_ptr, b_src, sb_ptr, d_ptr, Bn, D, R,
                       stride_ab, stride_ah, stride_sab, stride_sah, stride_sar,
                       stride_sbh, stride_sbn, stride_sbr, stride_db, stride_dh,
                       BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, TMA: tl.constexpr,
                       FP8_SOFT: tl.constexpr):
    """Output tile (row block, column block) of group ``h`` per program (grid: row blocks, column
    blocks, groups); BLOCK_K is the scale block width. ``a_src`` / ``b_src``: the fp8 tensors, with
    FP8_SOFT their fp16 * 2**-8 decodes (``e4m3_decode``), read by pointer loads, or with ``TMA``
    descriptors over ``a`` as [H, B, R] (block [1, BLOCK_M, BLOCK_K]) and ``b`` as [H, D, R] (block
    [1, BLOCK_N, BLOCK_K])."""
    h = tl.program_id(2)
    m0 = tl.program_id(0) * BLOCK_M
    n0 = tl.program_id(1) * BLOCK_N
    rows = m0 + tl.arange(0, BLOCK_M)
    cols = n0 + tl.arange(0, BLOCK_N)
    row_ok = rows < Bn
    col_ok = cols < D
    h64 = h.to(tl.int64)
    if TMA:
        a_rows = None
        b_rows = None
    else:
        a_rows = a_src + h64 * stride_ah + rows.to(tl.int64)[:, None] * stride_ab
        b_rows = b_src + (h64 * D + cols.to(tl.int64))[:, None] * R
    sa_rows = sa_ptr + h64 * stride_sah + rows.to(tl.int64) * stride_sab
    sb_base = sb_ptr + h64 * stride_sbh
    acc = tl.zeros((BLOCK_M, BLOCK_N), tl.float32)
    for kb in range(0, R // BLOCK_K):
        a, b, sa, sb = _operands(a_src, b_src, sa_rows, sb_base, a_rows, b_rows, row_ok, col_ok, cols, h, m0, n0, kb,
                                 stride_sar, stride_sbn, stride_sbr, BLOCK_M, BLOCK_N, BLOCK_K, TMA)
        acc += _scaled(tl.dot(a, tl.trans(b)), sa, sb, BLOCK_N, BLOCK_K)
    if FP8_SOFT:
        acc = acc * 65536.0
    out = d_ptr + rows.to(tl.int64)[:, None] * stride_db + h64 * stride_dh + cols[None, :]
    tl.store(out, acc.to(d_ptr.dtype.element_ty), mask=row_ok[:, None] & col_ok[None, :])


def _descriptors(a, b, block_m, block_n, block_k):
    """TMA descriptors for ``a`` [B, H, R] (as [H, B, R]) and ``b`` [H, D, R] with boxes of ``block_k``
    columns, or None when TMA cannot address them: bases and strides must be 16-byte multiples (fp8: 16
    elements), boxes at most 256 rows, and no dimension empty."""
    B, H, R = a.shape
    D = b.shape[1]
    strides = (a.stride(0), a.stride(1), R)
    if R == 0 or max(block_m, block_n) > 256 or a.data_ptr() % 16 or b.data_ptr() % 16 \
            or any(s <= 0 or s % 16 for s in strides):
        return None
    return (TensorDescriptor(a, [H, B, R], [a.stride(1), a.stride(0), 1], [1, block_m, block_k]),
            TensorDescriptor(b, [H, D, R], [D * R, R, 1], [1, block_n, block_k]))


def fp8_einsum(target: Target, args):
    B, H, R = args.a.shape
    D = args.b.shape[1]
    out = torch.empty(B, H, D, dtype=args.out_dtype, device=args.a.device) if args.out is None else args.out
    if B == 0:
        return out
    tune = target.tuning
    BM, BN, BK = tune.einsum_block_m, tune.einsum_block_n, scale_block(D, R, args.b_scale.shape[1:])
    soft = target.fp8_soft
    a, b = (e4m3_decode(args.a), e4m3_decode(args.b)) if soft else (args.a, args.b)
    descs = _descriptors(a, b, BM, BN, BK) if tune.einsum_tma and not soft else None
    a_src, b_src = descs or (a, b)
    grid = (triton.cdiv(B, BM), triton.cdiv(D, BN), H)
    _fp8_einsum_kernel[grid](
        a_src, args.a_scale, b_src, args.b_scale, out, B, D, R, a.stride(0), a.stride(1),
        *args.a_scale.stride(), *args.b_scale.stride(), out.stride(0), out.stride(1),
        BLOCK_M=BM, BLOCK_N=BN, BLOCK_K=BK, TMA=descs is not None, FP8_SOFT=soft,
        num_warps=tune.einsum_warps, num_stages=tune.einsum_stages,
    )
    return out


def warmup_calls(dims, limits, machine) -> list[dict]:
    """Warm-up (``dsv4ops.warmup``): one variant per layout of ``a`` (B is not specialized); ``out``
    given, so that a vendor run at every size (``jit_per_size``) writes views of one output."""
    return [dict(B=min(4, limits.max_tokens), H=dims.o_groups, D=dims.o_lora_rank, R=dims.o_group_k, group_major=g,
                 out=True) for g in (False, True)]
