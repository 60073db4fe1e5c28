"""Triton sparse_mla_prefill: the sparse MQA kernels of sparse_mla_decode.py with prefill tiles.

Prefill is compute-bound (T in the thousands, 64 or 128 heads, 1K+ selected rows per token): each
program holds a tile of ``prefill_block_h`` heads of one token, gathers ``prefill_block_k`` of its
selected rows per step (dequantized in registers, read straight from the paged caches) and runs two
tensor-core products per step (``[heads, 512] x [512, rows]`` scores, ``[heads, rows] x [rows, 512]``
output). The head tiles of one token are adjacent programs, so the second one reads the rows from L2.
The index list is split across programs only when T x head tiles cannot fill the GPU.
"""
from __future__ import annotations

from . import sparse_mla_decode
from .sparse_mla_decode import attend
from .tuning import Target


def sparse_mla_prefill(target: Target, a):
    tune = target.tuning
    return attend(a, tune.prefill_block_h, tune.prefill_block_k, tune.prefill_warps, tune.prefill_stages,
                  tune.decode_waves, target.fp8_soft)


def warmup_calls(dims, limits, machine) -> list[dict]:
    """Warm-up (``dsv4ops.warmup``): sparse_mla_decode's calls (the same kernel, ``attend``)."""
    return sparse_mla_decode.warmup_calls(dims, limits, machine)
