"""Intel XPU through vllm-xpu-kernels (``pip install vllm-xpu-kernels`` on a PyTorch XPU build; its
wheels are built against one torch XPU version, e.g. 0.1.16.2 for torch 2.14.0+xpu). IPEX
(intel-extension-for-pytorch) is discontinued and no longer used.

Served here (native SYCL kernels; ops first in vllm-xpu-kernels v0.1.11, schemas unchanged through
the 0.1.16.2 wheel):
  - qnorm_rope_kv_insert -> ``torch.ops._xpu_C.deepseek_qnorm_rope_kv_insert`` (bf16 cache only:
    see ``FP8_DS_MLA_REASON`` for why fp8_ds_mla is not routed);
  - paged_mqa_logits -> ``torch.ops._xpu_C.fp8_paged_mqa_logits`` (Xe2 only: BMG, LNL, PVC;
    block_size 64; same page split as the dsv4ops index cache);
  - indexer_topk -> ``torch.ops._C.top_k_per_row_prefill`` (the top-k ops are registered by
    ``vllm_xpu_kernels._C`` in the ``_C`` namespace, not ``_xpu_C``).
Not served: sparse_mla_decode and fp8_einsum have no vllm-xpu-kernels op with our contract
(``deepseek_inv_rope_fp8_quant`` produces wo_a's A operand, it is not the einsum); nor
inv_rope_fp8_quant: ``deepseek_inv_rope_fp8_quant`` encodes e4m3 with the same integer conversion
(values below 2^-6 of the block scale flushed or mis-encoded: up to 2^-7 of the scale off, where
docs/ops.md §8 allows 2^-8). The triton backend serves them, and every other call declined here, on XPU.
"""
from __future__ import annotations

import importlib

import torch

from dsv4ops.backend_support import all_of, index_mxfp4
from dsv4ops.formats import Layout
from dsv4ops.platform import Platform
from dsv4ops.registry import Backend, register_backend

INSTALL = '"dsv4ops[xpu]" (vllm-xpu-kernels, on a PyTorch XPU build)'
# torch op namespace -> (extension module that registers it, ops the adapters call)
NEEDS = {
    "_xpu_C": ("vllm_xpu_kernels._xpu_C", ("deepseek_qnorm_rope_kv_insert", "fp8_paged_mqa_logits")),
    "_C": ("vllm_xpu_kernels._C", ("top_k_per_row_prefill",)),
}
FIRST_RELEASE = {"deepseek_qnorm_rope_kv_insert": "0.1.11", "fp8_paged_mqa_logits": "0.1.8",
                 "top_k_per_row_prefill": "0.1.7"}
XE2_TAGS = ("bmg", "lnl", "pvc", "xe2")        # simulated arch names that is_xe2_arch() accepts
LOGITS_BLOCK = 64                              # fp8_paged_mqa_logits_xe2: block_size == kBlockKV
TOPK_MAX = 4096
FP8_DS_MLA_REASON = (
    "fp8_ds_mla: vllm-xpu-kernels' writer (fused_scale_to_fp8) flushes or mis-encodes e4m3 subnormals "
    "(|x / scale| < 2^-6), where docs/ops.md §6.1 rounds them; the cache bytes must be exact")

_missing: dict[str, str] = {}


def probe() -> str | None:
    """Import the extensions and check every op the adapters call is registered; name what is missing."""
    _missing.clear()
    for namespace, (module, ops) in NEEDS.items():
        try:
            importlib.import_module(module)
        except Exception as exc:
            return (f"cannot import {module} ({type(exc).__name__}: {str(exc)[:160]}); "
                    f"install {INSTALL}")
        for op in ops:
            if not _has_op(namespace, op):
                _missing[op] = (f"vllm-xpu-kernels lacks torch.ops.{namespace}.{op}: "
                                f"install vllm-xpu-kernels >= {FIRST_RELEASE[op]}")
    return None


def _has_op(namespace: str, op: str) -> bool:
    try:
        getattr(getattr(torch.ops, namespace), op)
    except (AttributeError, RuntimeError):
        return False
    return True


BACKEND = register_backend(Backend(
    "xpu", ("xpu",), probe=probe,
    description="Intel XPU SYCL ops from vllm-xpu-kernels (qnorm/RoPE/KV insert, paged logits, top-k)",
))


def has_op(op: str):
    def check(plat: Platform, call) -> str | None:
        return _missing.get(op)
    return check


def qnorm_inputs(plat: Platform, call) -> str | None:
    if call.layout.is_ds_mla:
        return FP8_DS_MLA_REASON
    if call.layout.kind != Layout.BF16:
        return f"layout {call.layout}: deepseek_qnorm_rope_kv_insert writes bf16 and fp8_ds_mla caches only"
    return None


def is_xe2(plat: Platform, device) -> bool:
    if plat.simulated:
        return plat.arch in XE2_TAGS
    index = device.index if device.index is not None else torch.xpu.current_device()
    return bool(torch.ops._xpu_C.is_xe2_arch(index))


def logits_inputs(plat: Platform, call) -> str | None:
    what = index_mxfp4(call)
    if what:
        return f"{what} (V4.1): fp8_paged_mqa_logits reads fp8 q and 132 B fp8 keys"
    if not is_xe2(plat, call.device):
        return f"fp8_paged_mqa_logits runs on Xe2 only (BMG, LNL, PVC), not {plat.device_name}"
    block_size = call.kv_cache.shape[1]
    if block_size != LOGITS_BLOCK:
        return f"block_size {block_size} != {LOGITS_BLOCK} (the Xe2 kernel's KV tile)"
    return None


def topk_inputs(plat: Platform, call) -> str | None:
    if call.k > TOPK_MAX:
        return (f"k={call.k} > {TOPK_MAX}: the SYCL kernel keeps k indices (and on rows of 200,000+ columns "
                "k values) in shared local memory")
    return None


_P = "dsv4ops.backends.xpu.ops"
BACKEND.implements("qnorm_rope_kv_insert", f"{_P}:qnorm_rope_kv_insert",
                   supports=all_of(has_op("deepseek_qnorm_rope_kv_insert"), qnorm_inputs))
BACKEND.implements("paged_mqa_logits", f"{_P}:paged_mqa_logits",
                   supports=all_of(has_op("fp8_paged_mqa_logits"), logits_inputs))
BACKEND.implements("indexer_topk", f"{_P}:indexer_topk",
                   supports=all_of(has_op("top_k_per_row_prefill"), topk_inputs))
