"""Pieces the examples share: running under a ``DSV4OPS_BACKEND`` setting, sliding-window indices,
the quantized o-projection weights, and GPU timing of a step."""
from __future__ import annotations

import contextlib
import os

import torch

from dsv4ops import settings
from dsv4ops.quant import to_fp8, ue8m0_scale

WINDOW, SWA_BLOCK, HEADS_PER_GROUP = 128, 64, 8      # V4 sliding window, SWA page size, heads per wo_a group


@contextlib.contextmanager
def backend_setting(setting: str):
    """``"auto"`` clears DSV4OPS_BACKEND; anything else is used as its value (the settings are
    re-read on entry and exit: dsv4ops reads the environment once, not per call)."""
    old = os.environ.pop("DSV4OPS_BACKEND", None)
    if setting != "auto":
        os.environ["DSV4OPS_BACKEND"] = setting
    settings.reload()
    try:
        yield
    finally:
        os.environ.pop("DSV4OPS_BACKEND", None)
        if old is not None:
            os.environ["DSV4OPS_BACKEND"] = old
        settings.reload()


def window_indices(positions: torch.Tensor, tables: torch.Tensor, window: int = WINDOW, block_size: int = SWA_BLOCK
                   ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """vLLM's SWA rule: each token's own slot (int64 [T]) and its window ``[max(p - window + 1, 0), p]``
    as cache indices (int32 [T, window], -1 after the valid prefix) and lengths (int32 [T]).
    ``positions`` int64 [T]; ``tables`` int32 [T, pages], the block-table row of each token's request."""
    p = positions
    start = (p - (window - 1)).clamp_min(0)
    tok = start[:, None] + torch.arange(window, device=p.device)[None, :]
    valid = tok <= p[:, None]
    pages = torch.gather(tables.long(), 1, (tok // block_size).clamp(max=tables.shape[1] - 1))
    idx = torch.where(valid, pages * block_size + tok % block_size, -1).to(torch.int32)
    slot = tables.long().gather(1, (p // block_size)[:, None])[:, 0] * block_size + p % block_size
    return slot, idx, valid.sum(1, dtype=torch.int32)


def o_proj_weights(groups: int, o_rank: int, g: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """Random ``wo_a`` in fp8_einsum's ``b`` form: fp8 [G, o_rank, 8 * 512] with power-of-two
    128 x 128 block scales fp32 [G, o_rank / 128, 32]."""
    w = torch.randn(groups, o_rank, HEADS_PER_GROUP * 512, generator=g) * 0.02
    blocks = w.view(groups, o_rank // 128, 128, -1, 128)
    scale = ue8m0_scale(blocks.abs().amax(dim=(2, 4)).clamp_min(1e-4))[0]
    return to_fp8(blocks / scale[:, :, None, :, None]).view(groups, o_rank, -1), scale


def time_us(step, graph: bool) -> tuple[float, float | None]:
    """Median µs of ``step`` run eagerly (host overhead included) and, with ``graph``, as a replayed
    CUDA graph (else None; the step must not synchronise: the reference does, with its boolean masks)."""
    import triton.testing

    eager = triton.testing.do_bench(step, warmup=25, rep=200, return_mode="median") * 1000
    if not graph:
        return eager, None
    step()
    cuda_graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(cuda_graph):
        step()
    return eager, triton.testing.do_bench(cuda_graph.replay, warmup=25, rep=200, return_mode="median") * 1000


def describe_times(eager: float, replay: float | None) -> str:
    return f"eager {eager:.1f} us" + ("" if replay is None else f"  graph replay {replay:.1f} us")
