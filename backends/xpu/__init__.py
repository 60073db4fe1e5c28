"""Intel XPU: the home for SYCL / IPEX implementations of the five ops.

None is registered yet: the SYCL ops that vLLM's XPU path uses (``torch.ops._xpu_C.*`` from
vllm-xpu-kernels: fused indexer-Q RoPE, scaling RoPE, fp8 GEMM/quant) do not implement any of the
five dsv4ops contracts as such, and no XPU is reachable here to pin down their arguments. On XPU
the ``triton`` backend serves all five ops (platform ``xpu`` in its capability checks, tunables in
``backends/triton/tuning.py``), and its decode applies the attention sink, which vLLM 0.33's XPU
decode path drops (spec Decision 4). See docs/backends.md for what an XPU user should run.
"""
from dsv4ops.backend_support import import_probe
from dsv4ops.registry import Backend, register_backend

BACKEND = register_backend(Backend(
    "xpu", ("xpu",),
    probe=import_probe("intel_extension_for_pytorch", '"dsv4ops[xpu]" (intel-extension-for-pytorch)'),
    description="Intel XPU SYCL ops (none adapted yet; the triton backend serves XPU)",
))
