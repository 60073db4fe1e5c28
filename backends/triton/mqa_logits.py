"""Triton op 11: one program per (block of query rows, block of keys), consecutive programs walking
the keys of one row block (its queries stay in cache). A program loads its keys once and scores
every (row, head) of the block against them with one tl.dot; tiles no row's [ks, ke) reaches are
skipped (with ``clean`` they are filled with -inf). The fp8 flavour is the inputs' dtype (OCP
``float8_e4m3fn`` or FNUZ ``float8_e4m3fnuz``): the kernel is specialised on it."""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from dsv4ops.platform import platform

from .tuning import tuning


@triton.jit
def _mqa_logits_kernel(q_ptr, k_ptr, scale_ptr, w_ptr, ks_ptr, ke_ptr, out_ptr, T, S, H,
                       stride_w0, stride_w1, stride_ks, stride_ke,
                       CLEAN: tl.constexpr, BLOCK_Q: tl.constexpr, H_PAD: tl.constexpr, BLOCK_S: tl.constexpr):
    pid = tl.program_id(0).to(tl.int64)                  # 1-D grid: no 65535 limit on either axis
    n_s = tl.cdiv(S, BLOCK_S)
    t0 = pid // n_s * BLOCK_Q
    s0 = (pid % n_s).to(tl.int32) * BLOCK_S
    t = t0 + tl.arange(0, BLOCK_Q)
    live_t = t < T
    lo = tl.load(ks_ptr + t * stride_ks, mask=live_t, other=S)
    hi = tl.load(ke_ptr + t * stride_ke, mask=live_t, other=0)
    s = s0 + tl.arange(0, BLOCK_S)
    out_rows = out_ptr + t[:, None] * S + s[None, :]
    in_bounds = live_t[:, None] & (s < S)[None, :]
    if (s0 < tl.max(hi, axis=0)) & (s0 + BLOCK_S > tl.min(lo, axis=0)):
        live_s = s < S
        d = tl.arange(0, 128)
        keys = tl.load(k_ptr + s.to(tl.int64)[:, None] * 128 + d[None, :], mask=live_s[:, None], other=0.0)
        scale = tl.load(scale_ptr + s, mask=live_s, other=0.0)
        r = tl.arange(0, BLOCK_Q * H_PAD)
        row = t0 + r // H_PAD
        head = r % H_PAD
        live_r = (head < H) & (row < T)
        q = tl.load(q_ptr + (row * H + head)[:, None] * 128 + d[None, :], mask=live_r[:, None], other=0.0)
        scores = tl.dot(q, tl.trans(keys)) * scale[None, :]
        w = tl.load(w_ptr + row * stride_w0 + head * stride_w1, mask=live_r, other=0.0)
        logits = tl.sum(tl.reshape(tl.maximum(scores, 0.0) * w[:, None], (BLOCK_Q, H_PAD, BLOCK_S)), axis=1)
        valid = (s[None, :] >= lo[:, None]) & (s[None, :] < hi[:, None])
        if CLEAN:
            tl.store(out_rows, tl.where(valid, logits, float("-inf")), mask=in_bounds)
        else:
            tl.store(out_rows, logits, mask=in_bounds & valid)
    elif CLEAN:
        tl.store(out_rows, tl.full((BLOCK_Q, BLOCK_S), float("-inf"), tl.float32), mask=in_bounds)


def mqa_logits(a):
    T, H, _ = a.q.shape
    S = a.k.shape[0]
    out = torch.empty(T, S, dtype=torch.float32, device=a.q.device) if a.out is None else a.out
    if T == 0 or S == 0:
        return out
    tune = tuning(platform(a.q.device))
    h_pad = max(16, triton.next_power_of_2(H))
    grid = (triton.cdiv(T, tune.mqa_block_q) * triton.cdiv(S, tune.mqa_block_s),)
    _mqa_logits_kernel[grid](
        a.q, a.k, a.k_scale, a.weights, a.ks, a.ke, out, T, S, H, a.weights.stride(0), a.weights.stride(1),
        a.ks.stride(0), a.ke.stride(0), CLEAN=a.clean, BLOCK_Q=tune.mqa_block_q, H_PAD=h_pad, BLOCK_S=tune.mqa_block_s,
        num_warps=tune.mqa_warps,
    )
    return out
