"""FlashMLA (``flash_mla``): sparse MODEL1 decode and sparse prefill on SM90 / SM100.

Prefill reads a gathered bf16 workspace (built in prefill.py), so it serves the layouts whose
rows dequantize exactly to bf16: fp8_ds_mla and bf16 (fp8_per_tensor has an fp8 query)."""
import functools
import importlib.metadata
import inspect

from dsv4ops import workspace
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
def _distribution() -> tuple[str, str] | None:
    """(name, version) of the installed distribution that provides ``flash_mla``, if one does."""
    names = importlib.metadata.packages_distributions().get("flash_mla", [])
    return (names[0], importlib.metadata.version(names[0])) if names else None


# Builds that import on an architecture they ship no kernels for: they raise at the first call there.
NO_KERNELS_FOR = {("sgl-flash-mla", "1.0.0"): ("sm90",)}


def build_has_kernels(plat: Platform, call) -> str | None:
    """Decline architectures the installed build is known to ship no kernels for (declared data: a
    capability check launches nothing)."""
    dist = _distribution()
    if dist is not None and plat.arch in NO_KERNELS_FOR.get(dist, ()):
        return f"{dist[0]} {dist[1]} ships no {plat.arch} kernels (it imports there but raises at the first call)"
    return None


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
                    build_has_kernels),
    cannot_capture=workspace.CANNOT_CAPTURE,
)
BACKEND.implements(
    "sparse_mla_decode", "dsv4ops.backends.flashmla.decode:sparse_mla_decode",
    supports=all_of(arch_in("sm90", "sm100", "sm103"), layout_in("fp8_ds_mla"), topk_multiple, build_has_kernels),
)
