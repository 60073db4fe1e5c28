"""vLLM general plugin: DeepSeek-V4 attention through dsv4ops (docs/integration.md, "vLLM").

Entry point ``vllm.general_plugins: dsv4ops = dsv4ops.integrations.vllm:register``. vLLM calls
``register()`` in every process it starts; it does nothing unless ``DSV4OPS_VLLM=1``. vLLM is
imported inside ``register()`` only.
"""
from __future__ import annotations

from ... import settings
from .routing import log, native_ops, routed_calls, reset_routed_calls, STEPS

_installed = False


def enabled() -> bool:
    """``DSV4OPS_VLLM``: whether the plugin routes DeepSeek-V4 attention through dsv4ops."""
    return settings.current().vllm


ENTRY_POINT = "dsv4ops.integrations.vllm:register"


def installed() -> bool:
    """Whether the ``vllm.general_plugins`` entry point is in the installed dsv4ops metadata."""
    import importlib.metadata

    return any(ep.value == ENTRY_POINT for ep in importlib.metadata.entry_points(group="vllm.general_plugins"))


def status() -> str:
    """One line for ``dsv4ops info``: whether the plugin is installed and on."""
    where = "installed" if installed() else "not installed (reinstall dsv4ops to register its entry point)"
    switch = "on (DSV4OPS_VLLM=1)" if enabled() else "off (DSV4OPS_VLLM=1 turns it on)"
    return f"vLLM plugin: {where}, {switch}"


def register() -> None:
    """Install dsv4ops' attention class on vLLM's DeepSeek-V4 seams (once per process)."""
    global _installed
    if not enabled():
        log.debug("dsv4ops vLLM plugin: off (set DSV4OPS_VLLM=1 to route DeepSeek-V4 attention through dsv4ops)")
        return
    if _installed:
        return
    from . import install

    native = native_ops()                                   # ConfigError for unknown names, before patching
    install.install()
    _installed = True
    log.info("dsv4ops vLLM plugin: on; steps %s; vLLM's own kernels for %s",
             ", ".join(f"{step}={'+'.join(ops)}" for step, ops in STEPS.items()), sorted(native) or "no op")


__all__ = ["register", "enabled", "installed", "status", "routed_calls", "reset_routed_calls"]
