"""Portable Triton kernels for all five ops (CUDA, ROCm, XPU; the CPU through TRITON_INTERPRET=1)."""
from dsv4ops.backend_support import import_probe, triton_interpreter_enabled
from dsv4ops.platform import Platform
from dsv4ops.registry import Backend, register_backend

BACKEND = register_backend(Backend(
    "triton", ("cuda", "rocm", "xpu", "cpu"),
    probe=import_probe("triton", '"dsv4ops[triton]"'),
    description="portable Triton kernels (any Triton target; CPU via the interpreter)",
))


def runs_here(plat: Platform, call) -> str | None:
    """Triton runs on accelerators; CPU tensors only under the interpreter."""
    if call.device.type == "cpu" and not triton_interpreter_enabled():
        return "CPU tensors need TRITON_INTERPRET=1"
    return None
