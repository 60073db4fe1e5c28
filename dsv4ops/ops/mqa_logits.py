"""Op 11 (docs/ops.md §11): prefill lightning-indexer weighted-ReLU MQA logits over contiguous FP8 keys."""
from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor

from .. import formats
from ..opspec import Arg, OpSpec, define
from ..checker import Checker

FP8_TYPES = (torch.float8_e4m3fn, torch.float8_e4m3fnuz)     # OCP e4m3, or FNUZ e4m3 (gfx942)


def check(c: Checker, a):
    c.tensor("q", a.q, dtype=FP8_TYPES, shape=("T", "H", formats.INDEX_DIM), anchor=True, contiguous=True)
    T, H = a.q.shape[:2]
    c.tensor("k", a.k, dtype=a.q.dtype, shape=("S", formats.INDEX_DIM), contiguous=True)
    S = a.k.shape[0]
    c.tensor("k_scale", a.k_scale, dtype=torch.float32, shape=(S,), contiguous=True)
    c.tensor("weights", a.weights, dtype=torch.float32, shape=(T, H), last_dim_contiguous=True)
    c.tensor("ks", a.ks, dtype=torch.int32, shape=(T,))
    c.tensor("ke", a.ke, dtype=torch.int32, shape=(T,))
    c.bool_arg("clean", a.clean)
    c.out_buffer(a.out, dtype=torch.float32, shape=(T, S))
    c.in_range("ks", a.ks, 0, S + 1, what=f"range starts (at most the key count S={S})")
    c.in_range("ke", a.ke, 0, S + 1, what=f"range ends (at most the key count S={S})")
    c.not_above("ks", a.ks, "ke", a.ke)
    return a


def fake(a):
    return a.q.new_empty(a.q.shape[0], a.k.shape[0], dtype=torch.float32)


SPEC = OpSpec(
    name="mqa_logits",
    doc="""q fp8 [T, H, 128]; k fp8 [S, 128] (q's fp8 type) with k_scale fp32 [S] (positive);
    weights fp32 [T, H]; ks, ke int32 [T] with 0 <= ks <= ke <= S. Returns fp32 [T, S]:
    ``out[t, s] = sum_h weights[t, h] * relu(q[t, h] . k[s] * k_scale[s])`` for ks[t] <= s < ke[t];
    other columns unspecified, or exactly -inf with ``clean=True``.""",
    args=(
        Arg("q", Tensor), Arg("k", Tensor), Arg("k_scale", Tensor), Arg("weights", Tensor),
        Arg("ks", Tensor), Arg("ke", Tensor),
        Arg("clean", bool, False, keyword_only=True),
        Arg("out", Optional[Tensor], None, keyword_only=True, mutated=True),
    ),
    outputs="Tensor",
    check=check,
    fake=fake,
)
OP = define(SPEC)
mqa_logits = OP.function
