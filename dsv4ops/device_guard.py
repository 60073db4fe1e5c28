"""Run an implementation on the device of its tensors, whatever the current device is.

Vendor libraries and Triton launch on the *current* device; engines routinely call with tensors on
another GPU (pipeline stages, test harnesses). The dispatch core wraps every launch in this one
guard, so no backend needs its own.
"""
from __future__ import annotations

from typing import Any, Callable

import torch


def run_on(device: torch.device, fn: Callable[[Any], Any], args) -> Any:
    """``fn(args)`` with ``device`` current (a no-op for the CPU or when it already is)."""
    if device.type == "cpu" or device.index is None:
        return fn(args)
    accelerator = getattr(torch, device.type)              # torch.cuda (also ROCm), torch.xpu
    if accelerator.current_device() == device.index:
        return fn(args)
    with accelerator.device(device.index):
        return fn(args)
