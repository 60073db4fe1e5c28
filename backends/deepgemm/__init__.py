"""DeepGEMM (``deep_gemm``): paged and prefill MQA logits (SM90 recipe) and block-scaled FP8 einsum (SM90
recipe for 128-wide scale blocks, SM100 recipe (1, 32, 32) for 32-wide ones).

API generations, told apart by what the installed module declares (``api()``):
- 2.5 (tokenspeed-deepgemm 2.5.x): ``fp8_fp4_mqa_logits(..., clean_logits, max_seqlen_k, logits_dtype)``,
  ``fp8_fp4_paged_mqa_logits(..., clean_logits, logits_dtype, indices)``, plus the legacy ``fp8_*`` names;
- 2.8.0 (2.8.0 builds): 2.5's parameter lists (the logits are called as on 2.5), ``fp8_fp4_mqa_logits``
  adding ``schedule_meta``; the einsum and paged-head rules of the 2.8 line (``LINE_28``);
- 2.8 (2.8.2 on): ``fp8_fp4_mqa_logits(..., max_seqlen_k, schedule_meta)`` (compressed rows only, tail not
  cleaned), ``fp8_fp4_paged_mqa_logits(..., max_context_len, indices)``; the legacy names are gone;
- legacy: only ``fp8_mqa_logits`` / ``fp8_paged_mqa_logits`` (builds before the fp8_fp4 names).
"""
import functools
import threading

from dsv4ops.backend_support import all_of, declared_signature, import_probe, index_mxfp4
from dsv4ops.platform import Platform
from dsv4ops.quant import scale_block
from dsv4ops.registry import Backend, register_backend
from dsv4ops.vendor_wheels import install_hint

_DESCRIPTION = "DeepGEMM paged and prefill MQA logits, fp8 einsum (SM90 recipe)"
_import = import_probe("deep_gemm", f"tokenspeed-deepgemm, {install_hint(('tokenspeed-deepgemm',))}",
                       needs=("get_paged_mqa_logits_metadata",))


def api_generation(fp8_fp4_params: tuple[str, ...] | None, has_legacy: bool) -> str | None:
    """'2.5', '2.8.0', '2.8' or 'legacy' from ``fp8_fp4_mqa_logits``'s declared parameter names (None:
    absent) and whether ``fp8_mqa_logits`` exists; None for an API this adapter does not know."""
    if fp8_fp4_params is None:
        return "legacy" if has_legacy else None
    if "clean_logits" in fp8_fp4_params:
        return "2.8.0" if "schedule_meta" in fp8_fp4_params else "2.5"
    if "max_seqlen_k" in fp8_fp4_params and "schedule_meta" in fp8_fp4_params:
        return "2.8"
    return None


@functools.lru_cache(maxsize=4)
def _api_of(fp8_fp4, legacy) -> str | None:
    params = None if fp8_fp4 is None else tuple(declared_signature(fp8_fp4).parameters)
    return api_generation(params, legacy is not None)


def api() -> str | None:
    """The API generation of the installed ``deep_gemm`` (cached per function object)."""
    import deep_gemm

    return _api_of(getattr(deep_gemm, "fp8_fp4_mqa_logits", None), getattr(deep_gemm, "fp8_mqa_logits", None))


def _probe() -> str | None:
    """The import probe, then the API generation (shown in the description; an unknown one is a reason)."""
    reason = _import()
    generation = api() if reason is None else None
    BACKEND.description = _DESCRIPTION + (f"; installed: API {generation}" if generation else "")
    if reason is None and generation is None:
        return ("deep_gemm declares an unknown fp8_fp4_mqa_logits (neither API 2.5's clean_logits nor API 2.8's "
                "max_seqlen_k, schedule_meta): unsupported version")
    return reason


BACKEND = register_backend(Backend("deepgemm", ("cuda",), probe=_probe, description=_DESCRIPTION))

# The 2.8 line: csrc/apis/einsum.hpp and layout.hpp of 2.8.0.post20260910 / .post20260924 and 2.8.2.post20261020
# take the SM100 einsum recipe alike (fp8_einsum's parameters as 2.5's, plus 2.8.2's epilogue_class), and
# their attention.hpp the paged SM90 kernel with 32 or 64 heads. The 2.5 wheel ships no source to pin these
# from, and declares the same fp8_einsum: the generation (its logits declarations) tells the builds apart.
LINE_28 = ("2.8.0", "2.8")


def sm90_recipe(sm100_needs: str):
    """SM90 only; on SM100 / SM103 the reason names what DeepGEMM's SM100 recipe needs there."""
    def check(plat: Platform, call) -> str | None:
        if plat.arch == "sm90":
            return None
        if plat.arch in ("sm100", "sm103"):
            return f"DeepGEMM API {api()} on {plat.arch} needs {sm100_needs}: not adapted (SM90 recipe only)"
        return f"arch {plat.arch} not supported (needs sm90)"
    return check


# From 2.8's csrc/apis/attention.hpp (check_mqa_logits_q_and_weights, out_dtype, the paged call's `indices`).
# bf16 logits round by up to 2^-9 of a value, where docs/ops.md §3 allows 1e-4 of the products' magnitudes.
_SM100_LOGITS = sm90_recipe("MX (UE8M0, int32-packed) q and key scales, bf16 weights and, paged, `indices` with "
                            "next_n 1, and returns bf16 logits (rounding above the op's 1e-4 bound); dsv4ops' "
                            "index keys carry fp32 scales")


def einsum_recipe(plat: Platform, call) -> str | None:
    """The scale-block width each arch's recipe takes (2.8's csrc/apis/einsum.hpp, layout.hpp). SM90:
    128-wide blocks, recipe (1, 128, 128) with fp32 scales as given (fp8_bmm asserts gran_k 128). SM100 /
    SM103, the 2.8 line (``LINE_28``): 32-wide blocks, recipe (1, 32, 32); DeepGEMM packs each fp32 scale into its UE8M0
    exponent byte (mantissa dropped), exact for 32-wide scales, which the op requires to be powers of
    two, not for 128-wide ones, which may be any fp32."""
    _, D, R = call.b.shape
    block = scale_block(D, R, call.b_scale.shape[1:])
    if plat.arch == "sm90":
        if block != 128:
            return (f"{block}-wide scale blocks: DeepGEMM's SM90 fp8 einsum takes 128-wide K blocks only "
                    f"(recipe (1, 128, 128)); 32-wide blocks run on SM100")
        return None
    if plat.arch in ("sm100", "sm103"):
        if block == 128:
            return (f"DeepGEMM API {api()} on {plat.arch} keeps only the UE8M0 exponent of each fp32 scale; "
                    "128-wide block scales may be any fp32 (32-wide ones, powers of two, are served)")
        if api() not in LINE_28:
            return f"32-wide scale blocks on {plat.arch} are adapted for DeepGEMM API 2.8 (installed: API {api()})"
        return None
    return f"arch {plat.arch} not supported (needs sm90, or sm100 / sm103 for 32-wide blocks)"


def fp8_on_sm90(plat: Platform, call) -> str | None:
    """SM90 reads fp8 q and 132 B fp8 keys with fp32 scales: 2.8's MXFP4 (packed FP4 with MX scales)
    runs on SM100 only (attention.hpp: ``is_mx_sf == (arch_major == 10)``)."""
    what = index_mxfp4(call)
    if what:
        return (f"{what} (V4.1): DeepGEMM reads MXFP4 with MX scales on SM100 only; on {plat.arch} it takes "
                "fp8 q and 132 B fp8 keys (fp32 scales)")
    return None


def logits_shapes(plat: Platform, call) -> str | None:
    """Paged SM90: 64 heads (the 2.8 line's attention.hpp: 32 or 64), next_n 1 or 2, 64-token key pages."""
    _, next_n, H, _ = call.q.shape
    heads = (32, 64) if api() in LINE_28 else (64,)
    if H not in heads:
        return f"H={H}: DeepGEMM API {api()}'s paged kernel is built for {' or '.join(map(str, heads))} indexer heads"
    if next_n not in (1, 2):
        return f"next_n={next_n} unsupported on SM90 (1 or 2)"
    if call.kv_cache.shape[1] != 64:
        return f"key-cache block size {call.kv_cache.shape[1]} != 64"
    return None


def mqa_logits_shapes(plat: Platform, call) -> str | None:
    """SM90 fp8_mqa_logits: OCP fp8, 32 or 64 heads (128-wide keys are the op's)."""
    H = call.q.shape[1]
    if str(call.q.dtype) != "torch.float8_e4m3fn":
        return f"{str(call.q.dtype).replace('torch.', '')} inputs: DeepGEMM reads OCP float8_e4m3fn"
    if H not in (32, 64):
        return f"H={H}: the SM90 kernel is built for 32 or 64 heads"
    return None


def einsum_bf16_out(plat: Platform, call) -> str | None:
    if str(call.out_dtype) != "torch.bfloat16":
        return f"out_dtype {call.out_dtype} (DeepGEMM writes bf16)"
    return None


_bound_device: list = []       # the one CUDA device DeepGEMM serves in this process
_bind_lock = threading.Lock()


def one_device_per_process(plat: Platform, call) -> str | None:
    """DeepGEMM loads its JIT kernels into the CUDA context where they first run and launches them from
    there: on a second GPU of the same process they fail with CUDA_ERROR_INVALID_HANDLE (measured on
    an H200 pair, docs/perf/H200x2-multi-gpu.txt). Serve the first device asked about; decline others."""
    with _bind_lock:
        if not _bound_device:
            _bound_device.append(call.device)
    if call.device != _bound_device[0]:
        return (f"DeepGEMM serves one GPU per process (its JIT kernels live in {_bound_device[0]}'s context); "
                f"the inputs are on {call.device}")
    return None


BACKEND.implements("paged_mqa_logits", "dsv4ops.backends.deepgemm.ops:paged_mqa_logits",
                   supports=all_of(_SM100_LOGITS, fp8_on_sm90, logits_shapes, one_device_per_process))
BACKEND.implements("mqa_logits", "dsv4ops.backends.deepgemm.ops:mqa_logits",
                   supports=all_of(_SM100_LOGITS, fp8_on_sm90, mqa_logits_shapes, one_device_per_process))
BACKEND.implements("fp8_einsum", "dsv4ops.backends.deepgemm.ops:fp8_einsum",
                   supports=all_of(einsum_recipe, einsum_bf16_out, one_device_per_process),
                   jit_per_size="DeepGEMM's JIT picks its kernel configuration (block sizes among others) "
                                "from the GEMM's M dimension, the call's B")
