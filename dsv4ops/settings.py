"""Every ``DSV4OPS_*`` environment variable, read in one place.

The variables are read once, into an immutable ``Settings`` snapshot, when dsv4ops first needs them;
``reload()`` reads them again and drops every cached dispatch decision (call it after changing
``os.environ`` in-process; tests do). Reading the environment on every call would cost more than
the rest of a dispatch.
"""
from __future__ import annotations

import difflib
import os
import tempfile
import threading
import warnings
from dataclasses import dataclass
from typing import Callable

from .errors import ConfigError

VARIABLES = {
    "DSV4OPS_BACKEND": "backend choice: 'name', or 'op=a|b,*=c' (docs/api-changes.md)",
    "DSV4OPS_PLATFORM": "simulate a platform, 'vendor:arch' (e.g. cuda:sm100), for explain and tests",
    "DSV4OPS_DEBUG": "1/true/yes/on: value checks on accelerator tensors too (0/false/no/off: not)",
    "DSV4OPS_TRITON_TUNING": "Triton tunables over the platform's table, 'decode_block_h=64,...'",
    "DSV4OPS_TUNING_TABLE": "a selection table written by `dsv4ops tune`, consulted before priorities",
    "DSV4OPS_VERIFY": "re-run a sampled fraction of calls on the reference (docs/verify.md)",
    "DSV4OPS_JIT_MONITOR": "off|warn|error: report a Triton compile of a dsv4ops kernel (after warm-up)",
    "DSV4OPS_VLLM": "1/true/yes/on: the vLLM plugin routes DeepSeek-V4 attention through dsv4ops (default off)",
    "DSV4OPS_VLLM_NATIVE": "op1,op2: dsv4ops ops whose vLLM step keeps vLLM's own kernels (docs/integration.md)",
}

# Variables the test suite and CI read (not dsv4ops): known names, so never warned about.
TEST_VARIABLES = ("DSV4OPS_TIER", "DSV4OPS_VENDOR_WHEELS", "DSV4OPS_VLLM_WHEEL")

_TRUE, _FALSE = ("1", "true", "yes", "on"), ("", "0", "false", "no", "off")
VERIFY_ACTIONS = ("log", "raise")
JIT_MONITOR_MODES = ("off", "warn", "error")


@dataclass(frozen=True)
class VerifyConfig:
    """``rate``: the fraction of calls verified (0: off); ``action``: "log" or "raise" on a
    mismatch; ``dump_dir``: where a mismatching call's inputs are saved."""

    rate: float = 0.0
    action: str = "log"
    dump_dir: str = os.path.join(tempfile.gettempdir(), "dsv4ops-verify")

    @property
    def enabled(self) -> bool:
        return self.rate > 0


def parse_verify(value: str) -> VerifyConfig:
    """``"RATE[,log|raise][,dump=DIR]"`` -> VerifyConfig; ``""``, ``"0"`` or ``"off"``: off.

    RATE is a fraction in (0, 1] (``1``: every call). ConfigError names what is wrong."""
    items = [item.strip() for item in value.split(",")]
    if items in ([""], ["0"], ["off"]):
        return VerifyConfig()
    try:
        rate = float(items[0])
    except ValueError:
        rate = float("nan")
    if not 0 < rate <= 1:                        # NaN fails too
        raise ConfigError(f"DSV4OPS_VERIFY={value!r}: the rate {items[0]!r} must be a fraction in (0, 1] "
                          f"(e.g. 0.01 for one call in 100), or 0/off")
    action, dump_dir = None, VerifyConfig.dump_dir
    for item in items[1:]:
        name, eq, arg = item.partition("=")
        if not eq and item in VERIFY_ACTIONS and action is None:
            action = item
        elif eq and name.strip() == "dump" and arg.strip():
            dump_dir = arg.strip()
        else:
            raise ConfigError(f"DSV4OPS_VERIFY={value!r}: bad option {item!r}; expected 'RATE[,log|raise][,dump=DIR]' "
                              f"(the action at most once)")
    return VerifyConfig(rate, action or "log", dump_dir)


@dataclass(frozen=True)
class Settings:
    backend: str = ""
    platform: str = ""
    debug: bool = False
    triton_tuning: str = ""
    tuning_table: str = ""
    verify: VerifyConfig = VerifyConfig()
    jit_monitor: str = "off"
    vllm: bool = False
    vllm_native: tuple[str, ...] = ()


def parse_flag(name: str, value: str) -> bool:
    value = value.strip().lower()
    if value in _TRUE:
        return True
    if value in _FALSE:
        return False
    raise ConfigError(f"{name}={value!r}: expected one of {', '.join(v for v in _TRUE + _FALSE if v)}")


def parse_jit_monitor(value: str) -> str:
    """``DSV4OPS_JIT_MONITOR``: one of JIT_MONITOR_MODES (``""``: off)."""
    mode = value.strip().lower() or "off"
    if mode not in JIT_MONITOR_MODES:
        raise ConfigError(f"DSV4OPS_JIT_MONITOR={value!r}: expected one of {', '.join(JIT_MONITOR_MODES)}")
    return mode


_warned: set[str] = set()


def warn_unknown(names) -> None:
    """Warn once per process about each ``DSV4OPS_*`` name dsv4ops does not read (a misspelt
    variable is otherwise silently ignored), with the closest known name."""
    for name in sorted(n for n in names if n.startswith("DSV4OPS_") and n not in VARIABLES
                       and n not in TEST_VARIABLES and n not in _warned):
        _warned.add(name)
        prefix = len("DSV4OPS_")                   # compare what follows it: every name shares it
        close = difflib.get_close_matches(name[prefix:], [known[prefix:] for known in VARIABLES], n=1)
        hint = f"did you mean DSV4OPS_{close[0]}?" if close else f"dsv4ops reads {', '.join(VARIABLES)}"
        warnings.warn(f"{name} is not a dsv4ops variable and is ignored; {hint}", stacklevel=3)


def read_environment() -> Settings:
    """The snapshot of ``os.environ`` (raises ConfigError for a malformed flag or verify setting;
    warns about an unknown ``DSV4OPS_*`` name)."""
    env = os.environ
    warn_unknown(env)
    return Settings(
        backend=env.get("DSV4OPS_BACKEND", "").strip(),
        platform=env.get("DSV4OPS_PLATFORM", "").strip(),
        debug=parse_flag("DSV4OPS_DEBUG", env.get("DSV4OPS_DEBUG", "")),
        triton_tuning=env.get("DSV4OPS_TRITON_TUNING", "").strip(),
        tuning_table=env.get("DSV4OPS_TUNING_TABLE", "").strip(),
        verify=parse_verify(env.get("DSV4OPS_VERIFY", "").strip()),
        jit_monitor=parse_jit_monitor(env.get("DSV4OPS_JIT_MONITOR", "")),
        vllm=parse_flag("DSV4OPS_VLLM", env.get("DSV4OPS_VLLM", "")),
        vllm_native=tuple(op.strip() for op in env.get("DSV4OPS_VLLM_NATIVE", "").split(",") if op.strip()),
    )


_current: Settings | None = None
_lock = threading.Lock()
_listeners: list[Callable[[], None]] = []


def current() -> Settings:
    """The snapshot in force (read from the environment on first use)."""
    return _current if _current is not None else reload()


def reload() -> Settings:
    """Read the environment again; cached decisions made under the old snapshot are dropped."""
    global _current
    snapshot = read_environment()
    with _lock:
        _current = snapshot
    for listener in _listeners:
        listener()
    return snapshot


def on_reload(listener: Callable[[], None]) -> None:
    _listeners.append(listener)


def debug_enabled() -> bool:
    """``DSV4OPS_DEBUG``: run value checks (index ranges, lengths) on accelerator tensors too."""
    return current().debug
