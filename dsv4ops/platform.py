"""Which accelerator the inputs live on: vendor, architecture, device name, library versions.

Detection is cached per device. ``simulate_platform`` (or ``DSV4OPS_PLATFORM=vendor:arch``)
overrides it so that tests and ``explain`` can ask what an sm100 or gfx942 box would run.
"""
from __future__ import annotations

import contextlib
import dataclasses
import functools
import importlib.metadata
import platform as _host
import re
import threading
from dataclasses import dataclass, field

import torch

from . import settings
from .errors import ConfigError

VENDORS = ("cuda", "rocm", "xpu", "cpu")

# Distributions whose versions `dsv4ops info` reports (looked up in metadata, never imported).
_LIBRARIES = {
    "torch": ("torch",),
    "triton": ("triton", "pytorch-triton-rocm", "pytorch-triton-xpu"),
    "flash_mla": ("tokenspeed-flashmla", "sgl-flash-mla", "flash-mla"),
    "deep_gemm": ("tokenspeed-deepgemm", "sgl-deep-gemm", "deep-gemm"),
    "flashinfer": ("flashinfer-python",),
    "aiter": ("amd-aiter", "aiter"),
    "vllm_xpu_kernels": ("vllm-xpu-kernels",),
}


@dataclass(frozen=True)
class Platform:
    """vendor: cuda | rocm | xpu | cpu; arch: sm90, sm100, sm103, sm120, sm121, gfx942, gfx950, ..."""

    vendor: str
    arch: str
    device_name: str
    simulated: bool = False
    libraries: tuple[tuple[str, str], ...] = field(default=(), compare=False)

    @property
    def key(self) -> tuple[str, str]:
        return (self.vendor, self.arch)

    @property
    def model(self) -> str:
        """The device's model, the first word of its name like ``H100``, ``H200``, ``B200`` or ``MI300X``
        (``NVIDIA H100 80GB HBM3`` -> ``H100``); "" when none (a CPU, a simulation without a name)."""
        return next((w for w in self.device_name.split() if re.fullmatch(r"[A-Z]+\d+[A-Z]*", w)), "")

    def __str__(self) -> str:
        sim = " (simulated)" if self.simulated else ""
        return f"{self.vendor}:{self.arch} [{self.device_name}]{sim}"


def cuda_arch(major: int, minor: int) -> str:
    """Compute capability -> arch tag (9.0 -> sm90, 10.0 -> sm100, 12.1 -> sm121)."""
    return f"sm{major}{minor}"


def rocm_arch(gcn_arch_name: str) -> str:
    """``gcnArchName`` -> arch tag: 'gfx942:sramecc+:xnack-' -> 'gfx942'."""
    return gcn_arch_name.split(":")[0]


def library_versions() -> tuple[tuple[str, str], ...]:
    found = []
    for module, dists in _LIBRARIES.items():
        for dist in dists:
            try:
                found.append((module, f"{dist} {importlib.metadata.version(dist)}"))
                break
            except importlib.metadata.PackageNotFoundError:
                continue
    return tuple(found)


@functools.lru_cache(maxsize=None)
def _detect(device_type: str, index: int) -> Platform:
    libs = library_versions()
    if device_type == "cuda":
        props = torch.cuda.get_device_properties(index)
        if torch.version.hip:
            return Platform("rocm", rocm_arch(getattr(props, "gcnArchName", "gfx")), props.name, libraries=libs)
        return Platform("cuda", cuda_arch(props.major, props.minor), props.name, libraries=libs)
    if device_type == "xpu":
        name = torch.xpu.get_device_name(index)
        return Platform("xpu", "xpu", name, libraries=libs)
    return Platform("cpu", _host.machine() or "cpu", "host CPU", libraries=libs)


class _ThreadState(threading.local):
    simulated: Platform | None = None       # set by simulate_platform in this thread


thread_state = _ThreadState()

# What an arch tag looks like per vendor (a simulated platform must name a real one).
_ARCH_PATTERNS = {"cuda": r"sm\d{2,3}a?", "rocm": r"gfx[0-9a-f]{3,4}", "xpu": r"[a-z0-9_]+", "cpu": r"[a-z0-9_]+"}


def _env_simulation() -> Platform | None:
    spec = settings.current().platform
    return _parse_simulation(spec, "DSV4OPS_PLATFORM") if spec else None


@functools.lru_cache(maxsize=32)
def _parse_simulation(spec: str, source: str) -> Platform:
    vendor, _, arch = spec.partition(":")
    if vendor not in VENDORS or not re.fullmatch(_ARCH_PATTERNS[vendor], arch):
        raise ConfigError(f"{source}={spec!r}: expected 'vendor:arch' with vendor in {VENDORS} and an arch of "
                          f"that vendor (cuda: sm90, sm100, ...; rocm: gfx942, gfx950, ...), e.g. 'cuda:sm100'")
    return Platform(vendor, arch, f"simulated {vendor} {arch}", simulated=True)


@contextlib.contextmanager
def simulate_platform(vendor: str, arch: str, device_name: str | None = None):
    """Within the block, every device reports ``vendor:arch`` (for tests and ``explain``), named
    ``device_name`` if given (``"NVIDIA H200"``: what measured preferences key on)."""
    previous = thread_state.simulated
    thread_state.simulated = _parse_simulation(f"{vendor}:{arch}", "simulate_platform")
    if device_name is not None:
        thread_state.simulated = dataclasses.replace(thread_state.simulated, device_name=device_name)
    try:
        yield thread_state.simulated
    finally:
        thread_state.simulated = previous


def current_simulation() -> Platform | None:
    """The platform set by an enclosing ``simulate_platform`` block in this thread, if any."""
    return thread_state.simulated


def platform(device: torch.device | str | None = None) -> Platform:
    """The platform of ``device`` (default: the current accelerator if any, else the CPU)."""
    simulated = thread_state.simulated or _env_simulation()
    if simulated is not None:
        return simulated
    if device is None:
        device = default_device()
    device = torch.device(device)
    index = device.index if device.index is not None else _current_index(device.type)
    return _detect(device.type, index)


def default_device() -> torch.device:
    if torch.cuda.is_available():
        return torch.device("cuda", torch.cuda.current_device())
    if hasattr(torch, "xpu") and torch.xpu.is_available():
        return torch.device("xpu", torch.xpu.current_device())
    return torch.device("cpu")


def _current_index(device_type: str) -> int:
    if device_type == "cuda":
        return torch.cuda.current_device()
    if device_type == "xpu":
        return torch.xpu.current_device()
    return 0


def multiprocessors(device: torch.device) -> int:
    """Streaming multiprocessors (compute units) a kernel grid should fill; 4 on the CPU (interpreter)."""
    device = torch.device(device)
    if device.type == "cuda":
        return torch.cuda.get_device_properties(device).multi_processor_count
    if device.type == "xpu":
        return torch.xpu.get_device_properties(device).gpu_subslice_count
    return 4
