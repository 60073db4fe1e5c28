"""Triton op 1 (docs/ops.md §1): one launch, grid (T, G + 1) with G = cdiv(H, HEADS). Program (t, g < G)
reads HEADS bf16 query rows [HEADS, 512] once, normalizes them, rotates the RoPE pairs in registers
and writes each row with one store (bf16, or fp8 for fp8_per_tensor); program (t, G) ropes, quantizes
and inserts token t's KV row (if its slot is >= 0)."""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from dsv4ops.quant import FP8_MAX

from .common import ceil_log2, exp2_int, fp8_bytes, load_scalar, mxfp8_encode, scalar_arg, to_e4m3, v41_record_offsets
from .tuning import Target


@triton.jit
def _rope(e, o, cos, sin):
    return e * cos - o * sin, e * sin + o * cos


@triton.jit(do_not_specialize=["n_kv"])
def _qnorm_rope_kv_insert_kernel(
    q_ptr, kv_ptr, kv_stride, pos_ptr, pos_stride, cs_ptr, cache_ptr, slot_ptr, slot_stride, out_ptr, n_kv, H, eps,
    kv_scale, q_scale, block_size, page_bytes,
    LAYOUT: tl.constexpr, FNUZ: tl.constexpr, KV_SCALE_PTR: tl.constexpr, Q_SCALE_PTR: tl.constexpr,
    FP8_MAX: tl.constexpr, HEADS: tl.constexpr, FP8_SOFT: tl.constexpr, INLINE: tl.constexpr,
):
    t = tl.program_id(0).to(tl.int64)
    g = tl.program_id(1)
    pos = tl.load(pos_ptr + t * pos_stride)
    if g < tl.cdiv(H, HEADS):
        h = g * HEADS + tl.arange(0, HEADS)
        live = (h < H)[:, None]
        d = tl.arange(0, 512)
        rows = (t * H + h.to(tl.int64))[:, None] * 512 + d[None, :]
        x = tl.load(q_ptr + rows, mask=live, other=0.0).to(tl.float32)
        r = 1.0 / tl.sqrt(tl.sum(x * x, axis=1) / 512 + eps)
        e, o = tl.split(tl.reshape(x * r[:, None], (HEADS, 256, 2)))
        pair = tl.arange(0, 256)
        if LAYOUT != 2:       # [HEADS, 256] cos/sin share the bf16 rows' registers; fp8 rows (laid out for
                              # their store) shuffle a [256] vector more cheaply than the rows
            pair = tl.broadcast_to(pair[None, :], (HEADS, 256))
        rope = pair >= 224
        cos = tl.load(cs_ptr + pos * 64 + pair - 224, mask=rope, other=0.0)
        sin = tl.load(cs_ptr + pos * 64 + pair - 192, mask=rope, other=0.0)
        e2, o2 = _rope(e, o, cos, sin)
        y = tl.reshape(tl.join(tl.where(rope, e2, e), tl.where(rope, o2, o)), (HEADS, 512)).to(tl.bfloat16)
        if LAYOUT == 2:       # Layout.FP8_PER_TENSOR: fp8 q' = sat(bf16(q') / q_scale); q itself untouched
            qs = load_scalar(q_scale, Q_SCALE_PTR)
            tl.store(out_ptr + rows, to_e4m3(y.to(tl.float32) / qs, FP8_MAX, False, FP8_SOFT), mask=live)
        else:
            tl.store(out_ptr + rows, y, mask=live)
    elif t < n_kv:
        slot = tl.load(slot_ptr + t * slot_stride)
        if slot >= 0:
            i = tl.arange(0, 32)
            cos = tl.load(cs_ptr + pos * 64 + i)
            sin = tl.load(cs_ptr + pos * 64 + 32 + i)
            src = kv_ptr + t * kv_stride
            e, o = _rope(tl.load(src + 448 + 2 * i).to(tl.float32), tl.load(src + 449 + 2 * i).to(tl.float32), cos, sin)
            e = e.to(tl.bfloat16)
            o = o.to(tl.bfloat16)
            block = slot // block_size
            off = slot % block_size
            if LAYOUT == 4:                # Layout.MXFP8: the bf16 row (RoPE applied) as one V4.1 record
                pair = tl.arange(0, 256)
                rope = pair >= 224
                ev, od = tl.split(tl.reshape(tl.load(src + tl.arange(0, 512)).to(tl.float32), (256, 2)))
                cs = tl.load(cs_ptr + pos * 64 + pair - 224, mask=rope, other=0.0)
                sn = tl.load(cs_ptr + pos * 64 + pair - 192, mask=rope, other=0.0)
                e2, o2 = _rope(ev, od, cs, sn)
                ev = tl.where(rope, e2.to(tl.bfloat16).to(tl.float32), ev)
                od = tl.where(rope, o2.to(tl.bfloat16).to(tl.float32), od)
                values, scales = mxfp8_encode(tl.reshape(tl.join(ev, od), (1, 512)), 1, FP8_SOFT)
                data, sc = v41_record_offsets(off, block_size, 528, 512, INLINE)
                page = cache_ptr + block * page_bytes
                tl.store(page + data + tl.arange(0, 512)[None, :], values)
                tl.store(page + sc + tl.arange(0, 16)[None, :], scales)
            elif LAYOUT == 0:              # Layout.DS_MLA
                page = cache_ptr + block * page_bytes
                tile = tl.arange(0, 8)[:, None]
                col = tl.arange(0, 64)[None, :]
                live = tile < 7
                v = tl.load(src + tile * 64 + col, mask=live, other=0.0).to(tl.float32)
                amax = tl.maximum(tl.max(tl.abs(v), axis=1), 1e-4)
                ex = ceil_log2(amax / FP8_MAX)
                q8 = to_e4m3(v * exp2_int(-ex)[:, None], FP8_MAX, FNUZ, FP8_SOFT)
                data = page + off * 576
                tl.store(data + tile * 64 + col, q8.to(tl.uint8, bitcast=True), mask=live)
                rope = (data + 448).to(tl.pointer_type(tl.bfloat16))
                tl.store(rope + 2 * i, e)
                tl.store(rope + 2 * i + 1, o)
                byte = tl.where(tl.arange(0, 8) < 7, tl.minimum(tl.maximum(ex + 127, 0), 255), 0)
                tl.store(page + block_size * 576 + off * 8 + tl.arange(0, 8), byte.to(tl.uint8))
            else:
                dst = cache_ptr + (block * block_size + off) * 512
                d = tl.arange(0, 512)
                nope = d < 448
                v = tl.load(src + d, mask=nope, other=0.0)
                if LAYOUT == 1:            # Layout.BF16
                    tl.store(dst + d, v, mask=nope)
                    tl.store(dst + 448 + 2 * i, e)
                    tl.store(dst + 449 + 2 * i, o)
                else:
                    ks = load_scalar(kv_scale, KV_SCALE_PTR)
                    tl.store(dst + d, to_e4m3(v.to(tl.float32) / ks, FP8_MAX, False, FP8_SOFT), mask=nope)
                    tl.store(dst + 448 + 2 * i, to_e4m3(e.to(tl.float32) / ks, FP8_MAX, False, FP8_SOFT))
                    tl.store(dst + 449 + 2 * i, to_e4m3(o.to(tl.float32) / ks, FP8_MAX, False, FP8_SOFT))


def qnorm_rope_kv_insert(target: Target, a):
    T, H, _ = a.q.shape
    layout = a.layout
    out = a.out
    if out is None:
        out = torch.empty(T, H, 512, dtype=layout.query_dtype, device=a.q.device) if layout.has_tensor_scale else a.q
    if T == 0:
        return out
    ks, ks_ptr = scalar_arg(a.kv_scale)
    qs, qs_ptr = scalar_arg(a.q_scale)
    page_bytes = a.kv_cache.stride(0) if layout.is_paged_bytes else 0
    tune = target.tuning
    heads = min(tune.insert_heads, triton.next_power_of_2(H))
    soft = target.fp8_soft
    _qnorm_rope_kv_insert_kernel[(T, triton.cdiv(H, heads) + 1)](
        a.q, a.kv, a.kv.stride(0), a.positions, a.positions.stride(0), a.cos_sin_cache, fp8_bytes(a.kv_cache, soft),
        a.slot_mapping, a.slot_mapping.stride(0), fp8_bytes(out, soft), a.slot_mapping.shape[0], H,
        a.eps, ks, qs, a.block_size, page_bytes,
        LAYOUT=layout.kind, FNUZ=layout.fp8_flavour == "fnuz", KV_SCALE_PTR=ks_ptr, Q_SCALE_PTR=qs_ptr,
        FP8_MAX=FP8_MAX[layout.fp8_flavour or "ocp"], HEADS=heads, FP8_SOFT=soft,
        INLINE=layout.inline, num_warps=tune.insert_warps,
    )
    return out


def warmup_calls(dims, limits, machine) -> list[dict]:
    """Warm-up (``dsv4ops.warmup``): one call per cache layout (T and the KV rows are not specialized)."""
    return [dict(T=2, H=dims.heads, layout=lay, block_size=limits.swa_block) for lay in limits.layouts]
