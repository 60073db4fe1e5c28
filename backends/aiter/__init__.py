"""ROCm AITER (``aiter``, distribution ``amd-aiter``): sparse MLA decode through the released
``aiter.ops.triton.attention.pa_decode_sparse.pa_decode_sparse`` and per-row top-k through
``aiter.ops.topk.top_k_per_row_{decode,prefill}`` (gfx942 / gfx950), and sparse MLA prefill through
``aiter.ops.triton.attention.pa_prefill_sparse.pa_prefill_sparse`` (gfx950).

Release floors (first tag of ROCm/aiter carrying what the adapter passes):
  - decode on gfx950 (fp8_ds_mla / bf16 block caches, SWA + extra two-segment pass, 2-D OCP fp8
    pool with per-64 scales): ``pa_decode_sparse(..., *, extra_cache=...)``, AITER >= 0.1.20;
  - decode on gfx942 (flat bf16 pool, ``has_invalid``): AITER >= 0.1.17;
  - top-k with ``k=``: AITER >= 0.1.15 (before that k was fixed at 2048 in the C++);
  - prefill indexer logits (``mqa_logits``) through ``aiter.ops.triton.attention.fp8_mqa_logits``
    with ``clean_logits``: AITER >= 0.1.15 (backends/aiter/mqa_logits.py);
  - sparse prefill on gfx950 (``pa_prefill_sparse`` over a gathered bf16 pool, backends/aiter/
    prefill.py): AITER >= 0.1.20 (0.1.18 and 0.1.19 assert gfx1250). Other arches are declined: there
    it runs a Triton fallback that evaluates ``attn_sink or torch.empty(1)`` (an error for a sink of
    more than one head, uninitialised sinks without one), and gfx1250's two-pool path is not adapted.
PyPI's ``amd-aiter`` (0.1.7.post2.dev18) predates all of them; install a ROCm release wheel or build
from a tag. ``sparse_mla_fwd`` (aiter.ops.triton.attention.sparse_mla) is in no AITER release and is
not used.

Not routed to AITER, with the reason:
  - paged MQA logits (``pa_mqa_logits.deepgemm_fp8_paged_mqa_logits``): the page split matches
    ours (``bs*128`` fp8 bytes, then ``bs*4`` fp32 scales), but the plain kernel addresses the
    block table per token, i.e. it is correct only for block_size 1, and the ``Preshuffle=True``
    kernel (block_size % 16 == 0) expects each page's fp8 section permuted 16 x 16 by
    ``aiter.ops.shuffle.shuffle_weight``. Serving a dsv4ops cache (block_size 64, unshuffled)
    would need a relayout of the whole cache per call; it also takes only 1-D context lengths;
  - fp8_einsum: AITER's batched FP8 GEMMs scale activations per token group or per MX block and
    weights per batched tensor, not the 128 x 128 fp32 blocks of ``fp8_einsum``.
The triton backend serves those ops on ROCm.
"""
from __future__ import annotations

import importlib
import importlib.metadata
import inspect

from dsv4ops import workspace
from dsv4ops.backend_support import all_of, arch_in, index_mxfp4
from dsv4ops.formats import LAYOUTS
from dsv4ops.platform import Platform
from dsv4ops.registry import Backend, register_backend

INSTALL = '"dsv4ops[aiter]" (amd-aiter, a ROCm build of AITER >= 0.1.20)'
DECODE_MODULE = "aiter.ops.triton.attention.pa_decode_sparse"
TOPK_MODULE = "aiter.ops.topk"
PREFILL_MODULE = "aiter.ops.triton.attention.pa_prefill_sparse"
MQA_MODULE = "aiter.ops.triton.attention.fp8_mqa_logits"

# (module, function, keyword the adapter needs, first AITER release that has it)
NEEDS = {
    "decode_gfx950": (DECODE_MODULE, "pa_decode_sparse", "extra_cache", "0.1.20"),
    "decode_gfx942": (DECODE_MODULE, "pa_decode_sparse", "has_invalid", "0.1.17"),
    "topk": (TOPK_MODULE, "top_k_per_row_decode", "k", "0.1.15"),
    "topk_prefill": (TOPK_MODULE, "top_k_per_row_prefill", "k", "0.1.15"),
    "prefill": (PREFILL_MODULE, "pa_prefill_sparse", "has_invalid", "0.1.20"),
    "mqa_logits": (MQA_MODULE, "fp8_mqa_logits", "clean_logits", "0.1.15"),
}

_state: dict | None = None


def aiter_version() -> str:
    try:
        return importlib.metadata.version("amd-aiter")
    except importlib.metadata.PackageNotFoundError:
        pass
    try:
        mod = importlib.import_module("aiter")
    except Exception:
        return "(not installed)"
    return str(getattr(mod, "__version__", "(unknown version)"))


def _feature(module: str, func: str, keyword: str, floor: str, version: str) -> str | None:
    try:
        mod = importlib.import_module(module)
    except Exception as exc:
        if isinstance(exc, ModuleNotFoundError) and exc.name in (module, module.rpartition(".")[0]):
            return f"AITER {version} has no {func}: install AITER >= {floor}"
        return (f"AITER {version}: importing {module} failed ({type(exc).__name__}: {str(exc)[:120]}); "
                "its Gluon kernels need a Triton with triton.experimental.gluon AMD support")
    fn = getattr(mod, func, None)
    if fn is None:
        return f"AITER {version} has no {func}: install AITER >= {floor}"
    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return None
    if keyword not in params:
        return f"AITER {version} has no {func}({keyword}=...): install AITER >= {floor}"
    return None


def features() -> dict:
    """Per need in NEEDS: None when the installed AITER has it, else the reason (cached per probe)."""
    global _state
    if _state is None:
        version = aiter_version()
        _state = {name: _feature(*spec, version) for name, spec in NEEDS.items()}
    return _state


def probe() -> str | None:
    global _state
    _state = None
    try:
        importlib.import_module("aiter")
    except Exception as exc:
        return f"cannot import aiter ({type(exc).__name__}: {str(exc)[:160]}); install {INSTALL}"
    features()
    return None


BACKEND = register_backend(Backend(
    "aiter", ("rocm",), probe=probe,
    description="ROCm AITER pa_decode_sparse / pa_prefill_sparse (>= 0.1.20), fp8_mqa_logits and per-row top-k "
                "(gfx942/gfx950)",
    context=lambda plat: plat,              # pa_decode_sparse's arguments differ on gfx950
))

# What pa_decode_sparse reads per arch (v0.1.20, aiter/ops/triton/attention/pa_decode_sparse.py):
# gfx950's Gluon driver reads 3-D block caches (the 584-byte fp8_ds_mla page, OCP e4m3, or bf16)
# with the optional extra segment, and a 2-D OCP fp8 pool with [pages, D/64] fp32 scales (extra
# segment silently ignored there); every other arch takes the Triton kernel: a 2-D page-size-1 pool
# of q's dtype (or FNUZ fp8 with per-64 scales, which no dsv4ops layout is), no extra segment.
_GFX950_LAYOUTS = tuple(LAYOUTS[n] for n in ("fp8_ds_mla", "bf16", "fp8_per_tensor"))
_GFX942_LAYOUTS = (LAYOUTS["bf16"],)


def decode_inputs(plat: Platform, call) -> str | None:
    if call.need_lse:
        return "AITER's pa_decode_sparse returns no log-sum-exp (call with need_lse=False)"
    if plat.arch == "gfx950":
        reason = features()["decode_gfx950"]
        if reason:
            return reason
        if call.layout not in _GFX950_LAYOUTS:
            return (f"layout {call.layout} not read by AITER on gfx950 (needs {', '.join(map(str, _GFX950_LAYOUTS))}; "
                    "packed caches are decoded as OCP e4m3 only)")
        if call.layout.has_tensor_scale and call.extra_kv_cache is not None:
            return ("fp8_per_tensor with an extra cache: AITER's 2-D fp8 pool path ignores extra_cache "
                    "(two-segment pass only for the 3-D fp8_ds_mla / bf16 caches)")
        return None
    reason = features()["decode_gfx942"]
    if reason:
        return reason
    if call.layout not in _GFX942_LAYOUTS:
        return (f"layout {call.layout} not read by AITER on {plat.arch} (its Triton path reads a bf16 pool, "
                "or FNUZ fp8 with per-64 scales; the MODEL1 and OCP fp8 caches are gfx950-only)")
    if call.extra_kv_cache is not None:
        return "the SWA + extra two-segment pass is gfx950-only in AITER"
    return None


def topk_inputs(plat: Platform, call) -> str | None:
    f = features()
    return f["topk"] or f["topk_prefill"]


def prefill_inputs(plat: Platform, call) -> str | None:
    if call.need_lse:
        return "AITER's pa_prefill_sparse returns no log-sum-exp (call with need_lse=False)"
    if call.layout not in _PREFILL_LAYOUTS:
        return (f"layout {call.layout} not served by the AITER prefill adapter (needs fp8_ds_mla or bf16: "
                "its gathered bf16 pool holds exact rows of those, and the kernel takes bf16 queries)")
    return features()["prefill"]


_PREFILL_LAYOUTS = tuple(LAYOUTS[n] for n in ("fp8_ds_mla", "bf16"))


def mqa_logits_inputs(plat: Platform, call) -> str | None:
    """fp8_mqa_logits: a power-of-two head count of at least 16 (tl.arange, tl.dot rows); FNUZ inputs
    on gfx942 only (gfx950's Gluon kernel reads OCP e4m3)."""
    what = index_mxfp4(call)
    if what:
        return f"{what} (V4.1): AITER's fp8_mqa_logits reads fp8 q and keys"
    H = call.q.shape[1]
    if H < 16 or H & (H - 1):
        return f"H={H}: AITER's fp8_mqa_logits needs a power-of-two head count of at least 16"
    if str(call.q.dtype) == "torch.float8_e4m3fnuz" and plat.arch != "gfx942":
        return f"float8_e4m3fnuz inputs on {plat.arch}: AITER reads FNUZ fp8 on gfx942 only"
    return features()["mqa_logits"]


_P = "dsv4ops.backends.aiter.ops"
BACKEND.implements("sparse_mla_decode", f"{_P}:sparse_mla_decode",
                   supports=all_of(arch_in("gfx942", "gfx950"), decode_inputs))
BACKEND.implements("sparse_mla_prefill", "dsv4ops.backends.aiter.prefill:sparse_mla_prefill",
                   supports=all_of(arch_in("gfx950"), prefill_inputs), cannot_capture=workspace.CANNOT_CAPTURE)
BACKEND.implements("mqa_logits", "dsv4ops.backends.aiter.mqa_logits:mqa_logits",
                   supports=all_of(arch_in("gfx942", "gfx950"), mqa_logits_inputs))
BACKEND.implements("indexer_topk", f"{_P}:indexer_topk",
                   supports=all_of(arch_in("gfx942", "gfx950"), topk_inputs))
