"""Workarounds for vLLM 0.32.0's CPU build running DeepSeek-V4, applied in the engine's process before
vLLM is imported (``install()``). Test fixtures only: nothing here is part of dsv4ops.

1. ``triton_interpreter``: vLLM's DeepSeek-V4 metadata builders launch ``@triton.jit`` kernels even on
   the CPU, and PyPI's Triton has no CPU backend (vLLM then disables Triton and the launches fail with
   "'function' object is not subscriptable"). The kernels run through Triton's interpreter instead
   (``TRITON_INTERPRET=1``, set by the caller before anything imports Triton), and a stand-in "cpu"
   entry in ``triton.backends.backends`` lets vLLM's ``HAS_TRITON`` check pass. The stand-in breaks
   torch.compile (log-probabilities compile a helper), hence ``enforce_eager`` and logits captured by a
   logits processor instead of log-probabilities.
2. ``tile_scheduler_keys``: ``DeepseekV4CPUSparseSWAMetadataBuilder.build_tile_scheduler`` returns only
   the swaonly/c4a/c128a keys, and the shared builder reads "c1a" too (KeyError: 'c1a'); it returns
   every layer type, each with no scheduler (the CPU attention uses none).
3. ``skip_swa_indices`` (speed only): the CPU attention builds its window slots itself and never reads
   the SWA index lists that ``ComputeSWAIndicesAndLensKernel`` writes; interpreted, that kernel alone
   costs most of the metadata time, so it is replaced by a no-op.
"""
from __future__ import annotations

import importlib.abc
import os
import sys


def triton_interpreter():
    if os.environ.get("TRITON_INTERPRET") != "1":
        raise RuntimeError("set TRITON_INTERPRET=1 before starting the engine's process")
    import triton.backends

    class _StandInCPUDriver:
        @staticmethod
        def is_active():
            return True

    triton.backends.backends.setdefault("cpu", triton.backends.Backend(compiler=object, driver=_StandInCPUDriver))


def tile_scheduler_keys(module):
    from vllm.v1.attention.backends.mla import sparse_swa

    layer_types = [getattr(sparse_swa, name) for name in dir(sparse_swa) if name.startswith("_LAYER_TYPE_")]
    module.DeepseekV4CPUSparseSWAMetadataBuilder.build_tile_scheduler = (
        lambda self, num_decode_tokens: dict.fromkeys(layer_types))


def skip_swa_indices(module):
    class _NoKernel:
        def __call__(self, *args, **kwargs):
            return None

        def register_warmup(self, *args, **kwargs):
            return None

    module._COMPUTE_SWA_INDICES_AND_LENS_KERNEL = _NoKernel()


AFTER_IMPORT = {
    "vllm.models.deepseek_v4.cpu.cpu_mla": tile_scheduler_keys,
    "vllm.v1.attention.backends.mla.sparse_swa": skip_swa_indices,
}


class _PatchAfterImport(importlib.abc.MetaPathFinder):
    """Runs ``AFTER_IMPORT[name](module)`` right after the module named ``name`` executes."""

    def find_spec(self, name, path, target=None):
        if name not in AFTER_IMPORT:
            return None
        for finder in sys.meta_path:
            if finder is not self and (spec := finder.find_spec(name, path, target)) is not None:
                run = spec.loader.exec_module

                def exec_module(module, run=run):
                    run(module)
                    AFTER_IMPORT[name](module)
                spec.loader.exec_module = exec_module
                return spec
        return None


def install():
    """Apply every workaround; call before vLLM is imported."""
    if any(name in sys.modules for name in AFTER_IMPORT):
        raise RuntimeError("install() must run before vLLM's DeepSeek-V4 modules are imported")
    triton_interpreter()
    sys.meta_path.insert(0, _PatchAfterImport())
