"""FlashMLA (``flash_mla``): sparse MODEL1 decode and sparse prefill on SM90 / SM100.

Prefill reads a gathered bf16 workspace (built in prefill.py), so it serves the layouts whose
rows dequantize exactly to bf16: fp8_ds_mla and bf16 (fp8_per_tensor has an fp8 query)."""
import functools
import inspect

import torch

from dsv4ops.backend_support import all_of, arch_in, import_probe, layout_in
from dsv4ops.platform import Platform
from dsv4ops.registry import Backend, register_backend
from dsv4ops.vendor_wheels import install_hint

BACKEND = register_backend(Backend(
    "flashmla", ("cuda",),
    probe=import_probe("flash_mla", f"tokenspeed-flashmla, {install_hint(('tokenspeed-flashmla',))}",
                       needs=("flash_mla_with_kvcache",)),
    description="FlashMLA sparse decode and prefill (SM90/SM100)",
))


def topk_multiple(plat: Platform, call) -> str | None:
    """FlashMLA walks the index lists in tiles of 64 (128 for h_q = 128 on SM100)."""
    tile = 128 if plat.arch.startswith("sm10") and call.q.shape[1] > 64 else 64
    for name in ("indices", "extra_indices"):
        idx = call.get(name)
        if idx is not None and idx.shape[1] % tile:
            return f"{name} width {idx.shape[1]} is not a multiple of {tile}"
    return None


@functools.lru_cache(maxsize=None)
def _runs_on(device_index: int, op: str) -> str | None:
    """Run one tiny call of ``op`` (sparse_mla_decode or sparse_mla_prefill, which take the same
    arguments): some builds (sgl-flash-mla 1.0.0) load on SM90 but raise there."""
    import importlib

    from dsv4ops import formats
    from dsv4ops.ops import OPS

    module = importlib.import_module(".decode" if op == "sparse_mla_decode" else ".prefill", __name__)
    dev = torch.device("cuda", device_index)
    try:
        with torch.cuda.device(dev):
            cache = formats.allocate_kv_cache(1, 64, "fp8_ds_mla", dev)
            idx = torch.arange(64, dtype=torch.int32, device=dev).view(1, 64)
            getattr(module, op)(OPS[op].bind(
                torch.zeros(1, 64, 512, dtype=torch.bfloat16, device=dev), cache, idx,
                layout=formats.LAYOUTS["fp8_ds_mla"], block_size=64, softmax_scale=1.0))
            torch.cuda.synchronize(dev)
    except Exception as exc:
        return f"the installed flash_mla cannot run {op} on this GPU ({type(exc).__name__}: {str(exc)[:120]})"
    return None


def build_runs_here(plat: Platform, call) -> str | None:
    if plat.simulated or call.device.type != "cuda":
        return None
    return _runs_on(call.device.index if call.device.index is not None else torch.cuda.current_device(), call.op)


def sparse_fwd_available(plat: Platform, call) -> str | None:
    """flash_mla_sparse_fwd with ``attn_sink`` (the DeepSeek-V4 FlashMLA; V3.2 builds lack it)."""
    import flash_mla

    fn = getattr(flash_mla, "flash_mla_sparse_fwd", None)
    if fn is None:
        return "this flash_mla has no flash_mla_sparse_fwd"
    if "attn_sink" not in inspect.signature(fn).parameters:
        return "this flash_mla's flash_mla_sparse_fwd takes no attn_sink (a FlashMLA before DeepSeek-V4)"
    return None


BACKEND.implements(
    "sparse_mla_prefill", "dsv4ops.backends.flashmla.prefill:sparse_mla_prefill",
    supports=all_of(arch_in("sm90", "sm100", "sm103"), layout_in("fp8_ds_mla", "bf16"), sparse_fwd_available,
                    build_runs_here),
)
BACKEND.implements(
    "sparse_mla_decode", "dsv4ops.backends.flashmla.decode:sparse_mla_decode",
    supports=all_of(arch_in("sm90", "sm100", "sm103"), layout_in("fp8_ds_mla"), topk_multiple, build_runs_here),
)
