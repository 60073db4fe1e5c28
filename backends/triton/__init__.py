"""Portable Triton kernels for every op (CUDA, ROCm, XPU; the CPU through TRITON_INTERPRET=1)."""
import torch

from dsv4ops.backend_support import all_of, import_probe, triton_interpreter_enabled
from dsv4ops.platform import Platform
from dsv4ops.registry import Backend, register_backend

from .tuning import target, tuning

_import_triton = import_probe("triton", '"dsv4ops[triton]"')


def probe() -> str | None:
    """Triton imports; under TRITON_INTERPRET=1 its interpreter gets our fixes (interpreter.py)."""
    reason = _import_triton()
    if reason is None and triton_interpreter_enabled():
        from .interpreter import patch_triton_interpreter

        if not patch_triton_interpreter():
            return "TRITON_INTERPRET=1 but this Triton has no interpreter"
    return reason


BACKEND = register_backend(Backend(
    "triton", ("cuda", "rocm", "xpu", "cpu"),
    probe=probe,
    description="portable Triton kernels (any Triton target; CPU via the interpreter)",
    context=target,
))


def runs_here(plat: Platform, call) -> str | None:
    """Triton runs on accelerators; CPU tensors only under the interpreter."""
    if call.device.type == "cpu" and not triton_interpreter_enabled():
        return "CPU tensors need TRITON_INTERPRET=1"
    return None


def fp8_flavour_matches(plat: Platform, call) -> str | None:
    """FNUZ e4m3 (a layout's, or float8_e4m3fnuz inputs) exists on gfx942 only; OCP e4m3 everywhere
    else (ROCm gfx950 included)."""
    layout, q = call.get("layout"), call.get("q")
    if layout is not None:
        fnuz, what = layout.fp8_flavour == "fnuz", f"layout {layout}"
    else:
        fnuz, what = q is not None and q.dtype == torch.float8_e4m3fnuz, "float8_e4m3fnuz inputs"
    if fnuz and plat.vendor in ("cuda", "xpu"):
        return f"{what} (FNUZ fp8) is not supported on {plat.vendor}"
    return None


_P = "dsv4ops.backends.triton"
BACKEND.implements("qnorm_rope_kv_insert", f"{_P}.qnorm_rope_kv_insert:qnorm_rope_kv_insert",
                   supports=all_of(runs_here, fp8_flavour_matches))
BACKEND.implements("sparse_mla_decode", f"{_P}.sparse_mla_decode:sparse_mla_decode",
                   supports=all_of(runs_here, fp8_flavour_matches))
BACKEND.implements("sparse_mla_prefill", f"{_P}.sparse_mla_prefill:sparse_mla_prefill",
                   supports=all_of(runs_here, fp8_flavour_matches))


CUDA_GRID_YZ = 65535        # CUDA's limit on grid dimensions 1 and 2


def logits_grid_fits(plat: Platform, call) -> str | None:
    """paged_mqa_logits puts its blocks of result columns on grid dimension 1."""
    blocks = -(-call.max_context_len // tuning(plat).logits_block_t)
    if plat.vendor == "cuda" and blocks > CUDA_GRID_YZ:
        return (f"max_context_len={call.max_context_len} needs {blocks} column blocks on grid dimension 1; "
                f"CUDA allows {CUDA_GRID_YZ}")
    return None


BACKEND.implements("paged_mqa_logits", f"{_P}.paged_mqa_logits:paged_mqa_logits",
                   supports=all_of(runs_here, logits_grid_fits))
BACKEND.implements("paged_mqa_topk", f"{_P}.paged_mqa_topk:paged_mqa_topk", supports=all_of(runs_here, logits_grid_fits))
BACKEND.implements("fp8_einsum", f"{_P}.fp8_einsum:fp8_einsum", supports=runs_here)
BACKEND.implements("indexer_topk", f"{_P}.indexer_topk:indexer_topk", supports=runs_here)
BACKEND.implements("inv_rope_fp8_quant", f"{_P}.inv_rope_fp8_quant:inv_rope_fp8_quant", supports=runs_here)
BACKEND.implements("compress_kv_insert", f"{_P}.compress_kv_insert:compress_kv_insert", supports=runs_here)
BACKEND.implements("mqa_logits", f"{_P}.mqa_logits:mqa_logits", supports=all_of(runs_here, fp8_flavour_matches))
BACKEND.implements("mqa_topk", f"{_P}.mqa_topk:mqa_topk", supports=all_of(runs_here, fp8_flavour_matches))
