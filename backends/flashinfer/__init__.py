"""FlashInfer (``flashinfer``): DeepSeek-V4 sparse MLA decode on SM100 (TRTLLM-gen, bf16 /
per-tensor fp8 row caches) and SM120 (MODEL1 cache), and the ragged top-k on CUDA.

No fused Q-norm/RoPE/KV-insert of FlashInfer matches op 1's layouts (its DSV4 writers produce the
NVFP4 / V4.1 caches), so ``qnorm_rope_kv_insert`` is not served here.
"""
from dsv4ops.backend_support import import_probe, sm_major
from dsv4ops.platform import Platform
from dsv4ops.registry import Backend, register_backend

BACKEND = register_backend(Backend(
    "flashinfer", ("cuda",),
    probe=import_probe("flashinfer", '"dsv4ops[flashinfer]" (flashinfer-python)'),
    description="FlashInfer TRTLLM-gen / SM12x sparse MLA decode and ragged top-k",
))

_SM100 = ("sm100", "sm103")
_SM120 = ("sm120", "sm121")


def trtllm_inputs(plat: Platform, call) -> str | None:
    if call.layout not in ("bf16", "fp8_per_tensor"):
        return f"layout {call.layout!r}: the TRTLLM-gen kernels read bf16 / per-tensor fp8 rows"
    if call.need_lse:
        return "TRTLLM-gen DSV4 decode returns no log-sum-exp (call with need_lse=False)"
    if call.indices.shape[1] != 128:
        return f"SWA index width {call.indices.shape[1]} != 128 (the kernel's fixed SWA segment)"
    return None


def sm120_inputs(plat: Platform, call) -> str | None:
    if call.layout != "fp8_ds_mla":
        return f"layout {call.layout!r}: the SM120 kernels read the fp8_ds_mla (584 B) cache"
    return None


def decode_arch(plat: Platform, call) -> str | None:
    if plat.arch in _SM100:
        return trtllm_inputs(plat, call)
    if plat.arch in _SM120:
        return sm120_inputs(plat, call)
    return f"arch {plat.arch}: FlashInfer's DSV4 decode runs on {', '.join(_SM100 + _SM120)} only"


def sparse_mla_decode(**kwargs):
    """Route by the device's architecture (decided by the capability check above)."""
    from dsv4ops.platform import platform
    from .decode import decode_sm120, decode_trtllm

    arch = platform(kwargs["q"].device).arch
    return (decode_trtllm if arch in _SM100 else decode_sm120)(**kwargs)


def topk_arch(plat: Platform, call) -> str | None:
    """FlashInfer's CUB path before SM90 has only the single-block kernel (rows <= 8192)."""
    if sm_major(plat.arch) < 9 and call.logits.shape[1] > 8192:
        return f"rows wider than 8192 need SM90+ (got {plat.arch})"
    return None


BACKEND.implements("sparse_mla_decode", sparse_mla_decode, priority=90, supports=decode_arch)
# Below Triton until it has been measured and verified on hardware (docs/verified.md).
BACKEND.implements("indexer_topk", "dsv4ops.backends.flashinfer.topk:indexer_topk", priority=40,
                   supports=topk_arch)
