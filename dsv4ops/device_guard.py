"""Run an implementation on the device of its tensors, whatever the current device is.

Vendor libraries and Triton launch on the *current* device; engines routinely call with tensors on
another GPU (pipeline stages, test harnesses). The dispatch core wraps every launch in this one
guard, so no backend needs its own.
"""
from __future__ import annotations

import functools
from typing import Any, Callable

import torch


def run_on(device: torch.device, fn: Callable[[Any], Any], args) -> Any:
    """``fn(args)`` with ``device`` current (a no-op for the CPU or when it already is)."""
    accelerator = getattr(torch, device.type)              # torch.cuda (also ROCm), torch.xpu
    if accelerator.current_device() == device.index:
        return fn(args)
    with accelerator.device(device.index):
        return fn(args)


def bound_to(device: torch.device, fn: Callable[[Any], Any]) -> Callable[[Any], Any]:
    """``fn`` made to run on ``device``: ``fn`` itself where no other device can be current (the CPU,
    or the only visible accelerator), else ``fn`` under the guard."""
    if device.type == "cpu" or device.index is None or _visible_devices(device.type) == 1:
        return fn
    return functools.partial(run_on, device, fn)


@functools.lru_cache(maxsize=None)
def _visible_devices(device_type: str) -> int:
    accelerator = getattr(torch, device_type, None)
    return accelerator.device_count() if accelerator is not None and hasattr(accelerator, "device_count") else 0
