"""The Triton MXFP4 encoder (backends/triton/common.py ``mxfp4_encode``, the V4.1 indexer key's
codec) against ``quant.encode_mxfp4``: bytes identical on rows with every corner block
(TRITON_INTERPRET=1)."""
import os

import pytest
import torch

import triton
import triton.language as tl

from dsv4ops import quant
from dsv4ops.backends.triton import common as c
from dsv4ops.backends.triton.interpreter import patch_triton_interpreter

pytestmark = pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1", reason="needs TRITON_INTERPRET=1")


@triton.jit
def encode(x_ptr, values_ptr, scales_ptr, R: tl.constexpr, D: tl.constexpr):
    rows = tl.arange(0, R)[:, None]
    values, scales = c.mxfp4_encode(tl.load(x_ptr + rows * D + tl.arange(0, D)[None, :]), R, D)
    tl.store(values_ptr + rows * (D // 2) + tl.arange(0, D // 2)[None, :], values)
    tl.store(scales_ptr + rows * (D // 32) + tl.arange(0, D // 32)[None, :], scales)


def corner_rows(D: int, seed: int) -> torch.Tensor:
    """8 rows of D: blocks that saturate, sit below the 6 * 2**-126 floor (fp32 subnormals), hold
    NaN, ±inf, -0 and zeros, e2m1 ties of both parities, amax / 6 an exact power of two, and
    random values over 60 binades."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(8, D, generator=g) * torch.pow(2.0, torch.randint(-60, 60, (8, D // 32), generator=g)
                                                   .float()).repeat_interleave(32, 1)
    x[0, :32] = torch.linspace(-1, 1, 32) * 1e-39                     # subnormal amax: exponent -126
    x[0, 32:64] = 6.0 * 2.0 ** -3                                      # amax / 6 a power of two
    x[1, :32] = -0.0
    x[1, 32:64] = 0.0
    x[1, 64] = -0.0
    ties = torch.tensor([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, 6.0])
    x[2, :32] = torch.cat([ties, -ties, ties * 1.0000001, -ties * 0.9999999])
    x[3, 5] = float("nan")
    x[4, 40] = float("inf")
    x[4, 0] = float("-inf")
    x[5, :32] = torch.tensor([-0.1, 0.2] * 16)                         # negatives that round to -0
    x[5, 31] = 6.0
    x[6, :32] = torch.linspace(-1, 1, 32) * 3e38                        # near the fp32 top
    return x


@pytest.mark.parametrize("D", [128, 512])
def test_mxfp4_encoder_matches_reference(D):
    assert patch_triton_interpreter()
    x = corner_rows(D, seed=D)
    values = torch.full((8, D // 2), 0xA5, dtype=torch.uint8)
    scales = torch.full((8, D // 32), 0xA5, dtype=torch.uint8)
    encode[(1,)](x, values, scales, R=8, D=D)
    want_values, want_scales = quant.encode_mxfp4(x)
    assert torch.equal(scales, want_scales), (scales != want_scales).nonzero()[:5].tolist()
    assert torch.equal(values, want_values), (values != want_values).nonzero()[:5].tolist()
    assert (want_scales == 255).sum() == 3 and (want_scales == 1).any()      # the corners are there
