"""Building blocks of the ops' cost models: the bytes and flops a kernel must move / do at least
(each input read once, each output written once), which ``dsv4ops bench`` turns into GB/s and TFLOP/s."""
from __future__ import annotations

import torch


def nbytes(*tensors) -> int:
    """Bytes of the given tensors (None and non-tensors count 0)."""
    return sum(t.numel() * t.element_size() for t in tensors if isinstance(t, torch.Tensor))


def selected_entries(indices: torch.Tensor, lens: torch.Tensor | None) -> int:
    """Valid entries of an index list ``[T, topk]`` (not -1, inside ``lens`` when given)."""
    valid = indices != -1
    if lens is not None:
        valid &= torch.arange(indices.shape[1], device=indices.device) < lens[:, None]
    return int(valid.sum())
