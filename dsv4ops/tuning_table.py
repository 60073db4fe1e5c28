"""Measured dispatch: a selection table written by ``dsv4ops tune``, consulted before priorities.

The table is a JSON file made on one device with one set of library versions::

    {"format": 1, "device": "NVIDIA H100 80GB HBM3", "platform": "cuda:sm90",
     "libraries": {"torch": "torch 2.11.0", "triton": "triton 3.6.0", ...},
     "entries": [{"op": "sparse_mla_decode", "bucket": "...", "size_class": 8, "choice": "triton",
                  "timings_us": {"triton": 81.2, "flashmla": 74.7}, "case": "..."}]}

Dispatch reads the file named by ``DSV4OPS_TUNING_TABLE``. An entry applies to calls in its shape
bucket (the op's dispatch key: every tensor's dtype and shape without the leading size, and the
non-float arguments) whose leading size (tokens, batch) has the nearest measured bit length
(``size_class``), on the device it was measured on, with the library versions it was measured
with; a table made elsewhere is ignored with a warning.
"""
from __future__ import annotations

import functools
import json
import os
import warnings
from dataclasses import dataclass

from . import settings
from .errors import ConfigError

FORMAT = 1


def bucket(key) -> str:
    """The shape bucket of a dispatch key: a stable string of its fields (the leading size's bit
    length, ``key.size_class``, is kept apart: a call takes the nearest measured one)."""
    parts = []
    for name, value in key.items():
        if hasattr(value, "dtype") and hasattr(value, "shape"):          # a TensorMeta
            dims = ",".join("*" if d is None else str(d) for d in value.shape)
            value = f"{str(value.dtype).replace('torch.', '')}[{dims}]"
        parts.append(f"{name}={value}")
    return ";".join(parts)


@dataclass(frozen=True)
class TuningTable:
    path: str
    device: str
    platform: str
    libraries: dict
    choices: dict                     # (op, bucket) -> {size_class: backend}

    def stale_because(self, plat) -> str | None:
        """Why this table does not describe ``plat`` (None if it does)."""
        if plat.device_name != self.device:
            return f"it was measured on {self.device}, this is {plat.device_name}"
        installed = dict(plat.libraries)
        changed = sorted(m for m in set(installed) | set(self.libraries) if installed.get(m) != self.libraries.get(m))
        if changed:
            return "library versions differ: " + ", ".join(
                f"{m} {self.libraries.get(m, 'absent')} -> {installed.get(m, 'absent')}" for m in changed)
        return None


def load(path: str) -> TuningTable:
    """Read a table (ConfigError naming the file when it cannot be used)."""
    try:
        stamp = os.stat(path).st_mtime_ns
    except OSError as exc:
        raise ConfigError(f"DSV4OPS_TUNING_TABLE={path!r}: cannot read ({exc.strerror})") from None
    return _load(path, stamp)


@functools.lru_cache(maxsize=8)
def _load(path: str, stamp: int) -> TuningTable:
    try:
        with open(path) as f:
            data = json.load(f)
        if data.get("format") != FORMAT:
            raise ValueError(f"format {data.get('format')!r}, expected {FORMAT}")
        choices: dict = {}
        for e in data["entries"]:
            choices.setdefault((e["op"], e["bucket"]), {})[int(e["size_class"])] = e["choice"]
        return TuningTable(path, data["device"], data["platform"], dict(data["libraries"]), choices)
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise ConfigError(f"DSV4OPS_TUNING_TABLE={path!r}: not a dsv4ops tuning table ({exc})") from None


def save(path: str, plat, entries: list[dict]) -> None:
    data = dict(format=FORMAT, device=plat.device_name, platform=f"{plat.vendor}:{plat.arch}",
                libraries=dict(plat.libraries), entries=entries)
    with open(path, "w") as f:
        json.dump(data, f, indent=1)


_warned: set = set()


def measured_choice(plat, op: str, key) -> tuple[str, str] | None:
    """(backend, table path) when the table in force has measured this call's bucket on ``plat``."""
    path = settings.current().tuning_table
    if not path or plat.simulated:
        return None
    table = load(path)
    why = table.stale_because(plat)
    if why is not None:
        if (path, plat.device_name) not in _warned:
            _warned.add((path, plat.device_name))
            warnings.warn(f"dsv4ops: ignoring tuning table {path}: {why}; run `dsv4ops tune` on this machine",
                          stacklevel=4)
        return None
    measured = table.choices.get((op, bucket(key)))
    if not measured:
        return None
    nearest = min(measured, key=lambda size: (abs(size - key.size_class), -size))
    return measured[nearest], path
