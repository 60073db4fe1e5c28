"""DeepGEMM (``deep_gemm``): paged MQA logits and block-scaled FP8 einsum on SM90 / SM100."""
from dsv4ops.backend_support import import_probe
from dsv4ops.registry import Backend, register_backend

BACKEND = register_backend(Backend(
    "deepgemm", ("cuda",),
    probe=import_probe("deep_gemm", '"dsv4ops[deepgemm]" (tokenspeed-deepgemm)', needs=("get_paged_mqa_logits_metadata",)),
    description="DeepGEMM paged MQA logits and fp8 einsum (SM90/SM100)",
))
