"""FlashMLA (``flash_mla``): sparse MODEL1 decode and sparse prefill on SM90 / SM100.

Prefill reads a gathered bf16 workspace (built in prefill.py), so it serves the layouts whose
rows dequantize exactly to bf16: fp8_ds_mla and bf16 (fp8_per_tensor has an fp8 query). No FlashMLA
prefill reads the V4.1 records (``prefill_records``).

Decode also reads the V4.1 records (528 B ``mxfp8_v41*`` main cache, 528 / 288 B ``nvfp4_v41*`` extra
cache) where the installed FlashMLA declares them (``api()``) and the device is SM100 / SM103."""
import functools
import importlib.metadata
import inspect

from dsv4ops import workspace
from dsv4ops.formats import Layout
from dsv4ops.backend_support import all_of, arch_in, declared_signature, import_probe, layout_in
from dsv4ops.platform import Platform
from dsv4ops.registry import Backend, register_backend
from dsv4ops.vendor_wheels import install_hint

_DESCRIPTION = "FlashMLA sparse decode and prefill (SM90/SM100; V4.1 caches: SM100)"
_import = import_probe("flash_mla", f"tokenspeed-flashmla, {install_hint(('tokenspeed-flashmla',))}",
                       needs=("flash_mla_with_kvcache",))


def _probe() -> str | None:
    """The import probe; the installed API generation is shown in the description."""
    reason = _import()
    BACKEND.description = _DESCRIPTION + ("" if reason else f"; installed: API {api()}")
    return reason


BACKEND = register_backend(Backend("flashmla", ("cuda",), probe=_probe, description=_DESCRIPTION))


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


# FlashMLA API generations, told apart by what the installed module declares (``api_generation``):
#   "v4"         tokenspeed-flashmla up to 1.0.0.post20260615: 584 B records only;
#   "v41"        tokenspeed-flashmla 1.0.0.post20260924: 584 / 528 / 288 B, split pages (a page holds its
#                data rows, then its scale rows), the V4.1 kernels built for SM100 / SM103 only; the
#                same release added the ``fused_norm_rope_attn_rope_cast`` module;
#   "v41-inline" deepseek-ai/FlashMLA from 2026-09-30 (``flash_mla_with_kvcache`` gained
#                ``enable_batch_invariant``): 528 / 288 B inline pages (each token's scales right after
#                its data), V4 records and SM90 dropped.
V41_PAGES = {"v41": False, "v41-inline": True}      # generation -> whether its V4.1 pages are inline
V41_ARCHS = ("sm100", "sm103")


def api_generation(kvcache_params: tuple[str, ...], has_fused_module: bool) -> str:
    """'v4', 'v41' or 'v41-inline' from ``flash_mla_with_kvcache``'s declared parameter names and
    whether the package has ``fused_norm_rope_attn_rope_cast`` (see the table above)."""
    if "enable_batch_invariant" in kvcache_params:
        return "v41-inline"
    return "v41" if has_fused_module else "v4"


@functools.lru_cache(maxsize=4)
def _api_of(with_kvcache, has_fused_module: bool) -> str:
    return api_generation(tuple(declared_signature(with_kvcache).parameters), has_fused_module)


def api() -> str:
    """The API generation of the installed ``flash_mla`` (cached per function object)."""
    import flash_mla

    return _api_of(flash_mla.flash_mla_with_kvcache, hasattr(flash_mla, "fused_norm_rope_attn_rope_cast"))


def v4_records(plat: Platform, call) -> str | None:
    """The 584 B fp8_ds_mla record: every generation but the inline one reads it (SM90 / SM100)."""
    return all_of(arch_in("sm90", "sm100", "sm103"), layout_in("fp8_ds_mla"))(plat, call) or (
        "this flash_mla (FlashMLA from 2026-09-30, inline V4.1 pages) dropped the V4 584 B record"
        if api() == "v41-inline" else None)


def v41_records(plat: Platform, call) -> str | None:
    """The V4.1 main cache (and its extra cache, in ``extra_layout``): a generation that
    declares them, an SM100 / SM103 device, and the page layout (split / inline) the generation reads;
    converting pages would copy the whole cache, so the other page layout is declined. The page pitch must be
    a multiple of the kernel's TMA stride, taken to be the layout's ``page_align`` (the alignment vLLM and
    SGLang pad these pages to); the check reads the page width, which is the pitch of a contiguous cache."""
    generation = api()
    if generation not in V41_PAGES:
        return f"this flash_mla (API {generation}) reads no V4.1 records (tokenspeed-flashmla 1.0.0.post20260924 does)"
    if plat.arch not in V41_ARCHS:
        return f"V4.1 kernels are SM100-only in this wheel (arch {plat.arch}; built for {', '.join(V41_ARCHS)})"
    caches = [("layout", call.layout)]
    if call.get("extra_kv_cache") is not None:
        caches.append(("extra_layout", call.extra_layout))
    inline = V41_PAGES[generation]
    for (name, layout), cache in zip(caches, ("kv_cache", "extra_kv_cache")):
        if layout.inline != inline:
            return (f"{name} {layout.name} has {'inline' if layout.inline else 'split'} pages; this flash_mla "
                    f"(API {generation}) reads {'inline' if inline else 'split'} V4.1 pages")
        width = call.get(cache).shape[1]
        if width % layout.page_align:
            return (f"{cache} page width {width} B is not a multiple of {layout.page_align} B (FlashMLA's V4.1 "
                    "kernels need block_stride_bytes % TMA_K_STRIDE == 0)")
    return None


# Sparse prefill, per generation. ``flash_mla_sparse_fwd(q, kv, indices, sm_scale, d_v, attn_sink,
# topk_length)`` takes a flat bf16 ``kv [s_kv, h_kv, d_qk]`` in every generation, so the adapter gathers one
# (prefill.py). The 0924 wheel has no prefill over the 528 / 288 B records: its fused_norm_rope_attn_rope_cast
# .prefill takes a bf16 kv too; only its decode entries read V4.1 pages. Kernels: the 0924 library carries
# Fwd_Sm90_Impl and Fwd_Sm100_{Head64,Head128,Head128_Small_TopK}_Impl; upstream's inline generation raises
# on anything but SM100f (deepseek-ai/FlashMLA csrc/api/sparse_prefill.cpp, commit 136b361a).
PREFILL_ARCHS = {"v4": ("sm90", "sm100", "sm103"), "v41": ("sm90", "sm100", "sm103"), "v41-inline": V41_ARCHS}
PREFILL_LAYOUTS = ("fp8_ds_mla", "bf16")
NO_V41_PREFILL = ("FlashMLA has no sparse prefill over the V4.1 records: flash_mla_sparse_fwd (and "
                  "fused_norm_rope_attn_rope_cast.prefill) take a flat bf16 kv [s_kv, 1, 512] in tokenspeed-flashmla "
                  "1.0.0.post20260924; only its decode entries read 528 / 288 B pages")


def prefill_records(plat: Platform, call) -> str | None:
    """The gathered-workspace prefill: V4.1 caches declined (``NO_V41_PREFILL``), then the arch the installed
    generation's ``flash_mla_sparse_fwd`` has kernels for, then the layouts the workspace serves."""
    generation = api()
    if call.layout.is_v41:          # the op pairs a V4.1 extra cache only with a V4.1 main cache
        return f"layout {call.layout}: {NO_V41_PREFILL} (installed: API {generation})"
    if plat.arch not in PREFILL_ARCHS[generation]:
        return (f"arch {plat.arch}: this flash_mla (API {generation}) builds flash_mla_sparse_fwd for "
                f"{', '.join(PREFILL_ARCHS[generation])} only")
    return layout_in(*PREFILL_LAYOUTS)(plat, call)


def decode_records(plat: Platform, call) -> str | None:
    """V4.1 main caches (MXFP8 records) go to ``v41_records``, the others to ``v4_records``."""
    return (v41_records if call.layout.kind == Layout.MXFP8 else v4_records)(plat, call)


BACKEND.implements(
    "sparse_mla_prefill", "dsv4ops.backends.flashmla.prefill:sparse_mla_prefill",
    supports=all_of(prefill_records, sparse_fwd_available, build_has_kernels),
    cannot_capture=workspace.CANNOT_CAPTURE,
)
BACKEND.implements(
    "sparse_mla_decode", "dsv4ops.backends.flashmla.decode:sparse_mla_decode",
    supports=all_of(decode_records, topk_multiple, build_has_kernels),
)
