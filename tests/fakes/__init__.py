"""Stand-ins for vendor entry points that cannot run here (no SM100 / SM120 / ROCm / XPU GPU).

Each implements the vendor's *documented* semantics (quoted from its docstrings) in plain
PyTorch, and checks the documented argument contract, so that a contract test runs the dsv4ops
adapter's own code end to end: argument mapping, padding, index tables, scales, LSE conventions.
"""
