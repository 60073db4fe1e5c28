"""FlashMLA (``flash_mla``): sparse MODEL1 decode on SM90 / SM100."""
from dsv4ops.backend_support import import_probe
from dsv4ops.registry import Backend, register_backend

BACKEND = register_backend(Backend(
    "flashmla", ("cuda",),
    probe=import_probe("flash_mla", '"dsv4ops[flashmla]" (tokenspeed-flashmla)', needs=("flash_mla_with_kvcache",)),
    description="FlashMLA sparse decode (SM90/SM100, fp8_ds_mla cache)",
))
