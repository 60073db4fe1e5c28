"""Intel XPU: SYCL ops (``torch.ops._xpu_C`` / intel-extension-for-pytorch) and XPU-tuned Triton."""
from dsv4ops.backend_support import import_probe
from dsv4ops.registry import Backend, register_backend

BACKEND = register_backend(Backend(
    "xpu", ("xpu",),
    probe=import_probe("intel_extension_for_pytorch", '"dsv4ops[xpu]" (intel-extension-for-pytorch)'),
    description="Intel XPU SYCL ops and XPU-tuned Triton kernels",
))
