"""DeepGEMM (``deep_gemm``): paged and prefill MQA logits and block-scaled FP8 einsum on SM90 / SM100."""
import threading

from dsv4ops.backend_support import all_of, arch_in, import_probe
from dsv4ops.platform import Platform
from dsv4ops.registry import Backend, register_backend

BACKEND = register_backend(Backend(
    "deepgemm", ("cuda",),
    probe=import_probe("deep_gemm", '"dsv4ops[deepgemm]" (tokenspeed-deepgemm)', needs=("get_paged_mqa_logits_metadata",)),
    description="DeepGEMM paged and prefill MQA logits, fp8 einsum (SM90; SM100 recipes not adapted yet)",
))


def logits_shapes(plat: Platform, call) -> str | None:
    _, next_n, H, _ = call.q.shape
    if H != 64:
        return f"H={H}: the kernels are built for 64 indexer heads"
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


_SM90_ONLY = arch_in("sm90")   # SM100 needs bf16 weights / MX scales and packed UE8M0: not adapted yet
BACKEND.implements("paged_mqa_logits", "dsv4ops.backends.deepgemm.ops:paged_mqa_logits",
                   supports=all_of(_SM90_ONLY, logits_shapes, one_device_per_process))
BACKEND.implements("mqa_logits", "dsv4ops.backends.deepgemm.ops:mqa_logits",
                   supports=all_of(_SM90_ONLY, mqa_logits_shapes, one_device_per_process))
BACKEND.implements("fp8_einsum", "dsv4ops.backends.deepgemm.ops:fp8_einsum",
                   supports=all_of(_SM90_ONLY, einsum_bf16_out, one_device_per_process))
