"""Portable Triton kernels for every op (CUDA, ROCm, XPU; the CPU through TRITON_INTERPRET=1).

Each op that reads or writes fp8 has one kernel source with two arithmetic paths (a ``tl.constexpr``
switch), registered as two implementations so that ``explain`` names the one that runs: ``triton``
(FP8 types and FP8 MMA, where the GPU has them) and ``triton (fp8 in software)`` (e4m3 decoded and
encoded with integer operations, bf16 / fp16 dots: NVIDIA sm80 / sm86, AMD without FP8 MMA).
``DSV4OPS_TRITON_TUNING=fp8_path=soft`` (or ``hw``) forces a path (tuning.py)."""
import torch

from dsv4ops import jit_monitor
from dsv4ops.backend_support import all_of, import_probe, index_mxfp4, triton_interpreter_enabled
from dsv4ops.platform import Platform
from dsv4ops.registry import Backend, register_backend

from .tuning import cuda_sm, fused_chunk_budget, has_fp8_mma, target, tuning

_import_triton = import_probe("triton", '"dsv4ops[triton]"')


def probe() -> str | None:
    """Triton imports; under TRITON_INTERPRET=1 its interpreter gets our fixes (interpreter.py).
    The JIT compile monitor (dsv4ops/jit_monitor.py) hooks into it here; it reports only when on."""
    reason = _import_triton()
    if reason is None:
        jit_monitor.install()
    if reason is None and triton_interpreter_enabled():
        from .interpreter import patch_triton_interpreter

        if not patch_triton_interpreter():
            return "TRITON_INTERPRET=1 but this Triton has no interpreter"
    return reason


def warmup_session(machine, workers, on_compile):
    """Warm-up: Triton launches compile without running (warmup.py, which imports Triton)."""
    from .warmup import session

    return session(machine, workers, on_compile)


BACKEND = register_backend(Backend(
    "triton", ("cuda", "rocm", "xpu", "cpu"),
    probe=probe,
    description="portable Triton kernels (any Triton target; CPU via the interpreter)",
    context=target,
    warmup_session=warmup_session,
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


def fp8_in_hardware(plat: Platform, call) -> str | None:
    """The FP8 path runs where the platform has FP8 MMA and e4m3 conversions (``has_fp8_mma``)."""
    path = tuning(plat).fp8_path
    if path == "soft":
        return "DSV4OPS_TRITON_TUNING fp8_path=soft forces the software fp8 path"
    if not has_fp8_mma(plat):
        return (f"{plat.vendor}:{plat.arch} has no FP8 tensor cores or e4m3 conversions"
                + (" (fp8_path=hw cannot change that)" if path == "hw" else "; the software fp8 path serves it"))
    return None


def fp8_in_software(plat: Platform, call) -> str | None:
    """The software fp8 path runs where the FP8 one cannot (or when forced), OCP e4m3 only."""
    if tuning(plat).fp8_path == "hw":
        return "DSV4OPS_TRITON_TUNING fp8_path=hw forces the FP8 path"
    if not target(plat).fp8_soft:
        return f"{_fp8_capability(plat)} (DSV4OPS_TRITON_TUNING=fp8_path=soft forces this path)"
    layout, q = call.get("layout"), call.get("q")
    if (layout is not None and layout.fp8_flavour == "fnuz") or (q is not None and q.dtype == torch.float8_e4m3fnuz):
        return "FNUZ e4m3 (gfx942) is served by the FP8 path only"
    return None


def _fp8_capability(plat: Platform) -> str:
    """Why the FP8 path serves ``plat``: FP8 tensor cores on a GPU; Triton's own fp8 types on XPU
    and in the interpreter (a CPU has no tensor cores)."""
    if plat.vendor == "cpu":
        return "Triton's interpreter runs the fp8 types as they are"
    if plat.vendor == "xpu":
        return f"{plat.vendor}:{plat.arch} keeps Triton's own fp8 types"
    return f"{plat.vendor}:{plat.arch} has FP8 tensor cores"


def bf16_tensor_cores(plat: Platform, call) -> str | None:
    """The attention's dots take the bf16 query: bf16 MMA, CUDA from sm80. (fp16 cannot stand in:
    the dequantized cache values carry UE8M0 scales up to 2^+-127.) The fp8 x fp8 products of the
    other ops run in fp16 on the software path, which sm75 has."""
    if plat.vendor == "cuda" and cuda_sm(plat) < 80:
        return f"{plat.arch}: the attention needs bf16 tensor cores (sm80 and newer)"
    return None


def mxfp4_bf16_dots(plat: Platform, call) -> str | None:
    """The indexer logits on MXFP4 keys dot exactly decoded bf16 tiles: bf16 MMA (CUDA from sm80)."""
    what = index_mxfp4(call)
    if what and plat.vendor == "cuda" and cuda_sm(plat) < 80:
        return f"{what} (V4.1): their dots take bf16 tiles, which need bf16 tensor cores (sm80 and newer)"
    return None


def implements(op: str, supports, **options) -> None:
    """Register ``op``'s wrapper ``backends/triton/<op>.py:<op>``, with its module's warm-up
    declaration ``warmup_calls(dims, limits, machine)``."""
    module = f"dsv4ops.backends.triton.{op}"
    BACKEND.implements(op, f"{module}:{op}", supports=supports, warmup=f"{module}:warmup_calls", **options)


def implements_both_paths(op: str, supports) -> None:
    """Register ``op``'s wrapper twice: the FP8 path and the software fp8 path, each behind
    ``supports`` and its own path check."""
    implements(op, all_of(supports, fp8_in_hardware))
    implements(op, all_of(supports, fp8_in_software), name="triton (fp8 in software)")


implements_both_paths("qnorm_rope_kv_insert", all_of(runs_here, fp8_flavour_matches))
implements_both_paths("sparse_mla_decode", all_of(runs_here, fp8_flavour_matches, bf16_tensor_cores))
implements_both_paths("sparse_mla_prefill", all_of(runs_here, fp8_flavour_matches, bf16_tensor_cores))


CUDA_GRID_YZ = 65535        # CUDA's limit on grid dimensions 1 and 2


def logits_grid_fits(plat: Platform, call) -> str | None:
    """paged_mqa_logits puts its blocks of result columns on grid dimension 1."""
    blocks = -(-call.max_context_len // tuning(plat).logits_block_t)
    if plat.vendor == "cuda" and blocks > CUDA_GRID_YZ:
        return (f"max_context_len={call.max_context_len} needs {blocks} column blocks on grid dimension 1; "
                f"CUDA allows {CUDA_GRID_YZ}")
    return None


def topk_grid_fits(plat: Platform, call) -> str | None:
    """paged_mqa_topk's fused kernel has no grid axis over the context; its chunked composition
    (``fused_chunk_budget``) launches paged_mqa_logits' grid."""
    tune = tuning(plat)
    row_bytes = call.q.shape[1] * call.max_context_len * 4
    if fused_chunk_budget(tune, call.topk, tune.logits_block_t, row_bytes, tune.fused_chunk_bytes) is None:
        return None
    return logits_grid_fits(plat, call)


implements_both_paths("paged_mqa_logits", all_of(runs_here, logits_grid_fits, mxfp4_bf16_dots))
implements_both_paths("paged_mqa_topk", all_of(runs_here, topk_grid_fits, mxfp4_bf16_dots))
implements_both_paths("fp8_einsum", runs_here)
implements("indexer_topk", runs_here)
implements_both_paths("inv_rope_fp8_quant", runs_here)
implements_both_paths("compress_kv_insert", runs_here)
implements_both_paths("mqa_logits", all_of(runs_here, fp8_flavour_matches, mxfp4_bf16_dots))
implements_both_paths("mqa_topk", all_of(runs_here, fp8_flavour_matches, mxfp4_bf16_dots))
implements("candidate_blocks", runs_here)


def mxfp4_keys_need_bf16(plat: Platform, call) -> str | None:
    """68 B MXFP4 keys are dotted in bf16 (their scales span 2^-127..2^127, past fp16): sm80 and newer."""
    cache = call.get("kv_cache")
    if cache is not None and cache.shape[-1] == 68:
        return bf16_tensor_cores(plat, call)
    return None


implements_both_paths("paged_sparse_mqa_logits", all_of(runs_here, mxfp4_keys_need_bf16))
implements_both_paths("sparse_mqa_logits", runs_here)
