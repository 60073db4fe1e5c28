"""Environment settings read on the hot path (no caching: tests and users may change them)."""
import os


def debug_enabled() -> bool:
    """``DSV4OPS_DEBUG=1``: run value checks (index ranges, lengths) on accelerator tensors too."""
    return os.environ.get("DSV4OPS_DEBUG", "") not in ("", "0")
