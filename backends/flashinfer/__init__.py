"""FlashInfer (``flashinfer``): TRTLLM-gen DSV4 decode (SM100), SM12x sparse MLA, ragged top-k."""
from dsv4ops.backend_support import import_probe
from dsv4ops.registry import Backend, register_backend

BACKEND = register_backend(Backend(
    "flashinfer", ("cuda",),
    probe=import_probe("flashinfer", '"dsv4ops[flashinfer]" (flashinfer-python)'),
    description="FlashInfer TRTLLM-gen / SM12x sparse MLA decode and ragged top-k",
))
