"""ROCm AITER (``aiter``): sparse MLA decode (Triton/Gluon) and per-row top-k (HIP) on gfx942 /
gfx950.

Not routed to AITER, because its kernels read other layouts than the dsv4ops contracts (a copy
per call would cost more than the Triton backend, which serves these ops on ROCm):
paged MQA logits (``aiter.ops.triton.attention.pa_mqa_logits``) reads per-token 132-byte records
``[blocks, 1, 1, D + 4]``, while the dsv4ops index cache stores each page's fp8 values before its
scales (DeepGEMM's layout); its batched FP8 GEMMs scale activations per token group or per MX
block and weights per batched tensor, not the 128 x 128 fp32 blocks of ``fp8_einsum``.
"""
from dsv4ops.backend_support import all_of, arch_in, import_probe
from dsv4ops.platform import Platform
from dsv4ops.registry import Backend, register_backend

BACKEND = register_backend(Backend(
    "aiter", ("rocm",),
    probe=import_probe("aiter", '"dsv4ops[aiter]" (amd-aiter, a ROCm build)'),
    description="ROCm AITER sparse MLA decode and top-k (gfx942/gfx950)",
))

# What AITER's sparse_mla_fwd reads per arch: the MODEL1 (fp8_dsv4_mla) cache and the two-segment
# (SWA + extra) pass are gfx950-only; gfx942 reads a flat bf16 pool, and fp8 in its native FNUZ
# encoding, which dsv4ops' fp8_per_tensor (OCP) layout is not.
_GFX950_LAYOUTS = ("fp8_ds_mla", "bf16", "fp8_per_tensor")
_GFX942_LAYOUTS = ("bf16",)


def decode_inputs(plat: Platform, call) -> str | None:
    if call.need_lse:
        return "AITER's sparse MLA returns no sink-free log-sum-exp (call with need_lse=False)"
    if plat.arch == "gfx950":
        if call.layout not in _GFX950_LAYOUTS:
            return f"layout {call.layout!r} not read by AITER on gfx950 (needs {', '.join(_GFX950_LAYOUTS)})"
        return None
    if call.layout not in _GFX942_LAYOUTS:
        return f"layout {call.layout!r} not read by AITER on gfx942 (MODEL1 and OCP fp8 caches are gfx950-only)"
    if call.extra_kv_cache is not None:
        return "the SWA + extra two-segment pass is gfx950-only in AITER"
    return None


def topk_inputs(plat: Platform, call) -> str | None:
    if call.seq_lens is None:
        return "row ranges: AITER's index convention for nonzero row starts is unconfirmed (use seq_lens)"
    return None


_P = "dsv4ops.backends.aiter.ops"
BACKEND.implements("sparse_mla_decode", f"{_P}:sparse_mla_decode", priority=80,
                   supports=all_of(arch_in("gfx942", "gfx950"), decode_inputs))
BACKEND.implements("indexer_topk", f"{_P}:indexer_topk", priority=80,
                   supports=all_of(arch_in("gfx942", "gfx950"), topk_inputs))
