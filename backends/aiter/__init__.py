"""ROCm AITER (``aiter``): sparse MLA, top-k per row, FP8 batched GEMM on gfx942 / gfx950."""
from dsv4ops.backend_support import import_probe
from dsv4ops.registry import Backend, register_backend

BACKEND = register_backend(Backend(
    "aiter", ("rocm",),
    probe=import_probe("aiter", '"dsv4ops[aiter]" (amd-aiter, a ROCm build)'),
    description="ROCm AITER kernels (gfx942/gfx950)",
))
