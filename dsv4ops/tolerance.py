"""Building blocks of the ops' comparison rules (docs/ops.md "Tolerances").

A rule gets the reference's and the backend's (kwargs after the call, result) and returns a
``Verdict``: ok, the worst error in units of the rule's tolerance, and the first failures.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from . import formats, quant


@dataclass
class Verdict:
    ok: bool
    worst: float = 0.0
    message: str = ""


class Collector:
    def __init__(self):
        self.worst = 0.0
        self.failures: list[str] = []

    def err(self, value: float):
        if not math.isnan(value):
            self.worst = max(self.worst, value)
        else:
            self.worst = float("nan")

    def require(self, ok: bool, message: str):
        if not ok:
            self.failures.append(message)

    def verdict(self) -> Verdict:
        return Verdict(not self.failures, self.worst, "; ".join(self.failures[:3]))


def calc_diff(x: torch.Tensor, y: torch.Tensor) -> float:
    """DeepGEMM's ``1 - 2*sum(xy) / sum(x^2 + y^2)`` in float64 (0 when both are zero)."""
    x, y = x.to(torch.float64), y.to(torch.float64)
    denom = (x * x + y * y).sum()
    return 0.0 if denom == 0 else float(1 - 2 * (x * y).sum() / denom)


def close(c: Collector, name: str, got: torch.Tensor, ref: torch.Tensor, *, atol: float, rtol: float,
           slack=None):
    """|got - ref| <= atol + rtol * |ref| (+ ``slack()``, an elementwise bound computed only when the
    first one fails somewhere) elementwise, with identical inf/NaN patterns."""
    got, ref = got.to(torch.float64), ref.to(torch.float64)
    if got.shape != ref.shape:
        c.require(False, f"{name}: shape {list(got.shape)} != {list(ref.shape)}")
        return
    if got.numel() == 0:
        return
    c.require(bool((got.isnan() == ref.isnan()).all()), f"{name}: NaN pattern differs "
              f"({int(got.isnan().sum())} NaN vs {int(ref.isnan().sum())} in the reference)")
    inf_same = (got.isinf() == ref.isinf()).all() and (got[got.isinf()] == ref[got.isinf()]).all()
    c.require(bool(inf_same), f"{name}: +-inf pattern differs")
    finite = ref.isfinite() & got.isfinite()
    diff = (got - ref).abs()[finite]
    full_bound = atol + rtol * ref.abs()
    if slack is not None and bool((diff > full_bound[finite]).any()):
        full_bound = full_bound + slack().to(torch.float64)
    bound = full_bound[finite]
    if diff.numel():
        exact = torch.where(diff > 0, math.inf, 0.0)             # where the bound is 0, only exact passes
        c.err(float(torch.where(bound > 0, diff / bound, exact).max()))
        bad = diff > bound
        if bool(bad.any()):
            where = torch.nonzero(((got - ref).abs() > full_bound) & finite)[0].tolist()
            c.require(False, f"{name}: {int(bad.sum())} elements out of tolerance, first at {where}: "
                             f"got {got[tuple(where)].item():.6g}, expected {ref[tuple(where)].item():.6g}")


def bf16_ulp_close(c, name, got_bytes: torch.Tensor, ref_bytes: torch.Tensor):
    """Two uint8 buffers holding little-endian bf16 values: at most 1 bf16 ulp apart."""
    close(c, name, got_bytes.contiguous().view(torch.bfloat16), ref_bytes.contiguous().view(torch.bfloat16),
           atol=1e-6, rtol=2 ** -7)


def fp8_ulp_close(c, name, got: torch.Tensor, ref: torch.Tensor):
    """fp8 values at most 1 e4m3 ulp apart (used where a bf16 input may differ by 1 ulp)."""
    close(c, name, got.to(torch.float32), ref.to(torch.float32), atol=2 ** -9, rtol=2 ** -3)


def abs_index_cache(cache: torch.Tensor) -> torch.Tensor:
    """The index key cache (132 B fp8 or 68 B MXFP4 keys) with every value replaced by its magnitude
    (sign bits cleared; scales are positive)."""
    nb, bs = cache.shape[:2]
    layout = formats.index_layout(cache)
    flat = cache.clone().reshape(nb, -1)
    flat[:, : bs * layout.data_bytes] &= 0x77 if layout.kind == formats.Layout.INDEX_MXFP4 else 0x7F
    return flat.view(cache.shape)


def fp8_abs(t: torch.Tensor) -> torch.Tensor:
    """fp8 values with their sign bits cleared (the magnitudes, same dtype); packed e2m1 (uint8)
    likewise, both nibbles."""
    if t.dtype == torch.uint8:
        return t & 0x77
    return t.view(torch.uint8).bitwise_and(0x7F).view(t.dtype)


def indexer_logits_rule(c: Collector, ref_result, got_result, magnitude, clean: bool, outside: str):
    """The weighted-ReLU logits rule shared by paged_mqa_logits and mqa_logits (docs/ops.md §3):
    on the valid region (reference finite) all finite, calc_diff < 1e-6 and |d| <= 1e-4 * magnitude;
    ``magnitude()`` gives sum_h |w_h| sum_d |q_hd| |k_d| per element. Returns that magnitude (None
    if not needed)."""
    if got_result.shape != ref_result.shape or got_result.dtype != torch.float32:
        c.require(False, f"expected fp32 {list(ref_result.shape)}, got {got_result.dtype} {list(got_result.shape)}")
        return None
    valid = ref_result != float("-inf")
    g, r = got_result[valid], ref_result[valid]
    c.require(bool(g.isfinite().all()), "non-finite logits inside the valid region")
    mag = None
    if r.numel():
        diff = calc_diff(g, r)
        c.err(diff / 1e-6)
        c.require(diff < 1e-6, f"calc_diff {diff:.3g} >= 1e-6")
        mag = magnitude()
        err = (g - r).abs() / (1e-4 * mag[valid] + 1e-30)
        c.err(float(err.max()))
        c.require(bool((err <= 1).all()), f"{int((err > 1).sum())} logits off by more than 1e-4 of sum |w||q||k|")
    if clean:
        c.require(bool((got_result[~valid] == float("-inf")).all()), f"clean=True: {outside} must be -inf")
    return mag


def topk_selection(c: Collector, logits, k, starts, ends, got_result, slack, name):
    """``got_result`` is a top-k of ``logits`` rows [starts, ends): min(k, n) distinct row-local
    indices then -1, and no unselected valid logit above a selected one by more than their ``slack``
    (the logits' own error bounds; None: exact ties only)."""
    R, W = logits.shape
    if tuple(got_result.shape) != (R, k) or got_result.dtype != torch.int32:
        c.require(False, f"{name}: expected int32 {[R, k]}, got {got_result.dtype} {list(got_result.shape)}")
        return
    if R == 0:
        return
    logits, got = logits.cpu().to(torch.float64), got_result.cpu().to(torch.int64)
    starts, ends = starts.cpu(), ends.cpu()
    n = (ends - starts).clamp_min(0)
    m = n.clamp(max=k)
    pos = torch.arange(k)
    in_prefix = pos[None, :] < m[:, None]
    prefix_ok = torch.where(in_prefix, (got >= 0) & (got < n[:, None]), got == -1)
    bad_rows = (~prefix_ok).any(1)
    c.require(not bool(bad_rows.any()), f"{name}: {int(bad_rows.sum())} rows are not min(k, n) valid row-local "
              f"indices followed by -1 (first bad row {int(torch.nonzero(bad_rows)[0]) if bad_rows.any() else -1})")
    if c.failures or W == 0:                    # W = 0: every row must be all -1, checked above
        return
    sorted_idx = torch.where(in_prefix, got, W + pos[None, :]).sort(1).values
    dup = (sorted_idx[:, 1:] == sorted_idx[:, :-1]).any(1)
    c.require(not bool(dup.any()), f"{name}: {int(dup.sum())} rows repeat an index")
    absolute = torch.where(in_prefix, got + starts[:, None], 0)
    selected = torch.zeros(R, W + 1, dtype=torch.bool).scatter_(1, torch.where(in_prefix, absolute, W), True)[:, :W]
    cols = torch.arange(W)
    valid = (cols >= starts[:, None]) & (cols < ends[:, None])
    slack = 0.0 if slack is None else slack.cpu().to(torch.float64)
    inf = torch.tensor(float("inf"), dtype=torch.float64)
    low = torch.where(selected, logits + slack, inf).amin(1)
    high = torch.where(valid & ~selected, logits - slack, -inf).amax(1)
    wrong = low < high
    c.require(not bool(wrong.any()), f"{name}: {int(wrong.sum())} rows miss a larger logit (not a tie), first row "
              f"{int(torch.nonzero(wrong)[0]) if wrong.any() else -1}")


# The relative error of the values a quantizer rounds, as two correct implementations may compute
# them: a scale one step off is allowed only for a block whose amax lies this close to the boundary
# where the two scales meet (docs/ops.md §7 "Scales one step off").
BF16_ROUNDING = 2 ** -7        # values rounded to bf16 before quantizing: one bf16 ulp apart
FP32_ROUNDING = 2 ** -16       # values computed in fp32: a few roundings (2^-22), with margin


def block_amax(rows: torch.Tensor, block: int) -> torch.Tensor:
    """fp32 ``[..., D]`` -> the largest magnitude of each ``block`` consecutive values ``[..., D / block]``."""
    return rows.to(torch.float32).reshape(*rows.shape[:-1], rows.shape[-1] // block, block).abs().amax(-1)


def scale_step_allowed(c: Collector, name: str, off: torch.Tensor, amax: torch.Tensor, boundary: torch.Tensor,
                       rel: float):
    """``off``: the blocks whose scale is one step from the reference's; each must have its reference
    ``amax`` within ``rel`` (relative) of the ``boundary`` amax where the two scales meet."""
    near = (amax.to(torch.float64) - boundary).abs() <= rel * boundary
    wrong = off & ~near
    c.require(not bool(wrong.any()), f"{name} scales: {int(wrong.sum())} blocks one step off the reference's "
              f"with their amax not within {rel:.3g} of the boundary between the two scales, first at "
              f"{torch.nonzero(wrong)[0].tolist() if wrong.any() else None}")


def fp8_blocks_close(c: Collector, name: str, got: tuple, ref: tuple, block: int, amax: torch.Tensor, rel: float):
    """fp8 values with power-of-two scales per ``block`` values of the last dim (``(values, scales)``):
    each scale equal to the reference's, or one power of two off where the reference block's ``amax``
    (before rounding, shaped as the scales) lies within ``rel`` of the boundary ``448 * scale`` between
    the two; every dequantized value within one e4m3 step of the reference's (2^-3 relative, plus twice
    a subnormal step of the larger scale)."""
    (gv, gs), (rv, rs) = got, ref
    if gv.shape != rv.shape or gs.shape != rs.shape or gv.dtype != rv.dtype:
        c.require(False, f"{name}: got {gv.dtype} {list(gv.shape)} / {list(gs.shape)}, expected "
                         f"{rv.dtype} {list(rv.shape)} / {list(rs.shape)}")
        return
    if gv.numel() == 0:
        return
    ratio = gs.to(torch.float64) / rs.to(torch.float64)
    step = (ratio == 2) | (ratio == 0.5)
    c.require(bool(((ratio == 1) | step).all()),
              f"{name} scales: {int(((ratio != 1) & ~step).sum())} differ by more than a factor of two "
              f"(or are not finite)")
    boundary = quant.FP8_MAX["ocp"] * torch.minimum(gs, rs).to(torch.float64)
    scale_step_allowed(c, name, step, amax, boundary, rel)
    expand = lambda s: s.to(torch.float64).repeat_interleave(block, dim=-1)
    got_x, ref_x = gv.to(torch.float64) * expand(gs), rv.to(torch.float64) * expand(rs)
    atol = 2 * 2 ** -9 * torch.maximum(expand(gs), expand(rs))
    diff, bound = (got_x - ref_x).abs(), atol + 2 ** -3 * ref_x.abs()
    c.err(float((diff / bound).max()))
    bad = ~(diff <= bound)
    c.require(not bool(bad.any()), f"{name}: {int(bad.sum())} dequantized values more than one e4m3 step off, "
              f"first at {torch.nonzero(bad)[0].tolist() if bad.any() else None}")
