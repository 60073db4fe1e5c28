"""Fake of DeepSelect's ``deep_select`` module (distribution ``tokenspeed-deepselect``), the top-k that
backends/deepselect calls. Written from DeepSelect's source, read for facts only:

- the parameter list of ``deep_select.topk`` and ``get_stride_requirement``: ``deep_select/interface.py``
  of the PyPI wheel ``tokenspeed-deepselect==1.0.0.post20260910`` (identical parameter list in
  deepseek-ai/DeepSelect ``deep_select/interface.py`` @ 0cae3b1aeabe4bce18893cd9ed1a394b8d38493c);
- the argument checks: ``csrc/api.cpp`` and ``csrc/structs.h`` @ 0cae3b1aeabe (``topk`` in [1, 4096],
  ``begin`` unsupported, ``vocab_size < 2^23``, input row stride a multiple of 1024 bytes with unit
  column stride, output row stride a multiple of 32 bytes, ``end`` / ``output_idx_offset`` int32
  contiguous ``[b]``);
- the selection: ``csrc/cuda_kernels/v3_fp32/topk_select.cuh`` and ``csrc/cuda_kernels/common_parts.cuh``
  @ 0f03b68748b304863fdf0181a11458d04ae533a9. Rows with ``end <= topk`` take the shortcut epilogue
  (indices ``0 .. end-1``, then ``idx_oob_fill_value`` without the offset). Longer rows are NaN-checked
  (``trap()``, or ``0x3F3F3F3F`` into ``output_idx[b][0]`` and nothing else written). ``-inf`` is the
  kernel's padding placeholder (``PLACEHOLDER = 0xff800000``; the row tail past ``end`` and the unused
  survivor slots hold it): only the first 32 KiB of a row (8192 fp32) is selected in element order, so
  in a longer row that has fewer than ``topk`` values above ``-inf`` the placeholders compete with the
  real ``-inf`` columns. This fake returns padding positions (``>= end``) for those slots: our reading
  of the source, not a hardware observation. Ties are broken towards higher columns ("Do NOT assume
  that the kernel will select a prefix index on ties") and the output is in column order.
"""
import sys
import types
from typing import Optional, Tuple

import torch

INPUT_STRIDE_BYTES, OUTPUT_STRIDE_BYTES = 1024, 32        # structs.h (CUDA build)
MAX_VOCAB_SIZE = 1 << 23
INIT_WINDOW = 32768 // 4                                   # fp32 elements selected in element order
NAN_MARK = 0x3F3F3F3F


def get_stride_requirement() -> Tuple[int, int]:
    """Returns the stride requirement for input / output tensors, in bytes"""
    return INPUT_STRIDE_BYTES, OUTPUT_STRIDE_BYTES


def _aligned_empty(rows, cols, device, dtype):
    """interface.py get_empty_and_aligned_tensor: rows padded to the 32-byte output stride."""
    per = OUTPUT_STRIDE_BYTES // dtype.itemsize
    return torch.empty(rows, (cols + per - 1) // per * per, device=device, dtype=dtype)[:, :cols]


def _row_topk(values: torch.Tensor, topk: int) -> torch.Tensor:
    """Columns of the ``topk`` largest of ``values`` (no NaN), ties towards higher columns, column order."""
    n = values.shape[0]
    above = int((values > float("-inf")).sum())
    if n > INIT_WINDOW and above < topk:                   # placeholders compete with real -inf
        real = torch.nonzero(values > float("-inf")).flatten()
        return torch.cat([real, n + torch.arange(topk - above)])
    flipped = torch.sort(values.flip(0), descending=True, stable=True).indices[:topk]
    return (n - 1 - flipped).sort().values


def topk(
    input: torch.Tensor,
    topk: int,
    sorted: bool = False,
    begin: Optional[torch.Tensor] = None,
    end: Optional[torch.Tensor] = None,
    indices_type: torch.dtype = torch.int64,
    sorted_index: bool = False,
    hint: Optional[torch.Tensor] = None,
    output_idx: Optional[torch.Tensor] = None,
    output_idx_offset: Optional[torch.Tensor] = None,
    idx_oob_fill_value: int = 2147483647,
    value_oob_fill_value: float = float("-inf"),
    return_value: bool = True,
    abort_when_nan_found: bool = True,
) -> Tuple[Optional[torch.Tensor], torch.Tensor]:
    """input (b, vocab) bf16/fp32, row stride a multiple of 1024 bytes, unit column stride; returns
    (values or None, indices (b, topk) of ``indices_type``)."""
    N, vocab = input.shape
    out_val = _aligned_empty(N, topk, input.device, input.dtype) if return_value else None
    if output_idx is None:
        output_idx = _aligned_empty(N, topk, input.device, indices_type)
    assert output_idx.dtype == indices_type
    assert begin is None, "`begin` is not supported now"
    assert hint is None, "`hint` is not supported now"
    assert 0 < topk <= 4096, "topk must be in [1, 4096]"
    assert not (sorted and (not return_value or sorted_index or input.dtype != torch.float32))
    assert input.dtype in (torch.bfloat16, torch.float32) and input.stride(1) == 1
    assert input.stride(0) * input.element_size() % INPUT_STRIDE_BYTES == 0, "input.stride(0) alignment"
    assert vocab < MAX_VOCAB_SIZE and indices_type in (torch.int32, torch.int64)
    assert tuple(output_idx.shape) == (N, topk) and output_idx.stride(1) == 1
    assert output_idx.stride(0) * output_idx.element_size() % OUTPUT_STRIDE_BYTES == 0, "output_idx.stride(0)"
    for name, t in (("end", end), ("output_idx_offset", output_idx_offset)):
        assert t is None or (t.dtype == torch.int32 and tuple(t.shape) == (N,) and t.is_contiguous()), name
    ends = end.tolist() if end is not None else [vocab] * N
    offsets = output_idx_offset.tolist() if output_idx_offset is not None else [0] * N
    assert all(0 <= e <= vocab for e in ends), "`end` <= `vocab_size` must be held"
    for b in range(N):
        n, values = ends[b], input[b, :ends[b]].float()
        if n <= topk:
            row = torch.full((topk,), idx_oob_fill_value, dtype=torch.int64)
            row[:n] = torch.arange(n) + offsets[b]
            output_idx[b] = row
            continue
        if bool(values.isnan().any()):
            if abort_when_nan_found:
                raise RuntimeError("[topk_select] NaN detected: trap (unspecified launch failure)")
            output_idx[b, 0] = NAN_MARK
            continue
        output_idx[b] = _row_topk(values, topk) + offsets[b]
    if out_val is not None:
        out_val.copy_(torch.gather(input.float(), 1, output_idx.long().clamp(0, vocab - 1)).to(input.dtype))
    return out_val, output_idx


CALLED = {
    "deep_select:get_stride_requirement": get_stride_requirement,
    "deep_select:topk": topk,
}


def install(monkeypatch, wrap=None):
    """Put the fake ``deep_select`` module in sys.modules; ``wrap(path, fn)`` may wrap each function."""
    module = types.ModuleType("deep_select")
    module.__version__ = "1.0.0.post20260910"
    for path, fn in CALLED.items():
        setattr(module, path.partition(":")[2], wrap(path, fn) if wrap else fn)
    monkeypatch.setitem(sys.modules, "deep_select", module)
