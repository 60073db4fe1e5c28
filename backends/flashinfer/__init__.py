"""FlashInfer (``flashinfer``): DeepSeek-V4 sparse MLA decode on SM100 (TRTLLM-gen, bf16 /
per-tensor fp8 row caches) and SM120 (MODEL1 cache), and the ragged top-k on CUDA.

No fused Q-norm/RoPE/KV-insert of FlashInfer matches op 1's layouts (its DSV4 writers produce the
NVFP4 / V4.1 caches), so ``qnorm_rope_kv_insert`` is not served here.
"""
from dsv4ops.backend_support import import_probe, sm_major
from dsv4ops.formats import LAYOUTS
from dsv4ops.platform import Platform
from dsv4ops.registry import Backend, register_backend

BACKEND = register_backend(Backend(
    "flashinfer", ("cuda",),
    probe=import_probe("flashinfer", '"dsv4ops[flashinfer]" (flashinfer-python)'),
    description="FlashInfer TRTLLM-gen / SM12x sparse MLA decode and ragged top-k",
))

_SM100 = ("sm100", "sm103", "sm107")          # trtllm-gen in 0.7.2: SM100/103/107
_SM120 = ("sm120", "sm121")
_TRTLLM_LAYOUTS = (LAYOUTS["bf16"], LAYOUTS["fp8_per_tensor"])
_DS_MLA = LAYOUTS["fp8_ds_mla"]


def trtllm_inputs(plat: Platform, call) -> str | None:
    if plat.arch not in _SM100:
        return f"arch {plat.arch}: the TRTLLM-gen DSV4 decode runs on {', '.join(_SM100)}"
    if call.layout not in _TRTLLM_LAYOUTS:
        return f"layout {call.layout}: the TRTLLM-gen kernels read bf16 / per-tensor fp8 rows"
    if call.need_lse:
        return "TRTLLM-gen DSV4 decode returns no log-sum-exp (call with need_lse=False)"
    if call.indices.shape[1] != 128:
        return f"SWA index width {call.indices.shape[1]} != 128 (the kernel's fixed SWA segment)"
    return None


def sm120_inputs(plat: Platform, call) -> str | None:
    if plat.arch not in _SM120:
        return f"arch {plat.arch}: the MODEL1 decode runs on {', '.join(_SM120)}"
    if call.layout is not _DS_MLA:
        return f"layout {call.layout}: the SM120 kernels read the fp8_ds_mla (584 B) cache"
    return None


def topk_arch(plat: Platform, call) -> str | None:
    """FlashInfer's CUB path before SM90 has only the single-block kernel (rows <= 8192)."""
    if sm_major(plat.arch) < 9 and call.logits.shape[1] > 8192:
        return f"rows wider than 8192 need SM90+ (got {plat.arch})"
    return None


_P = "dsv4ops.backends.flashinfer"
BACKEND.implements("sparse_mla_decode", f"{_P}.decode:decode_trtllm", name="flashinfer.trtllm_gen",
                   supports=trtllm_inputs)
BACKEND.implements("sparse_mla_decode", f"{_P}.decode:decode_sm120", name="flashinfer.sm120", supports=sm120_inputs)
# Below Triton until it has been measured and verified on hardware (priorities.OP_PRIORITY).
BACKEND.implements("indexer_topk", f"{_P}.topk:indexer_topk", supports=topk_arch)
