"""Stand-ins for vendor entry points that cannot run here (no SM100 / SM120 / ROCm / XPU GPU).

Each implements the vendor's *documented* semantics (quoted from its docstrings) in plain
PyTorch, and checks the documented argument contract, so that a contract test runs the dsv4ops
adapter's own code end to end: argument mapping, padding, index tables, scales, LSE conventions.
"""

import contextlib

from dsv4ops import registry


@contextlib.contextmanager
def reprobed(monkeypatch, backend_name: str):
    """``backend_name`` probes its library again inside the block (finding the fake just installed)
    and forgets that probe afterwards, so that later tests probe the real environment."""
    backend = registry.get_backend(backend_name)
    monkeypatch.setattr(backend, "_probed", None)
    try:
        yield backend
    finally:
        backend._probed = None
