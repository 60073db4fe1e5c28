"""The PyTorch references: one function per op, the definition of correct for every backend.

They compute in fp32 (fp64 for the einsum) from exactly the bytes a kernel would read, round only
where docs/ops.md says, and run on any device. Registered as the backend ``reference`` (lowest
priority). ``dsv4ops.reference.<op>(...)`` takes the public signature (validated, then the
reference runs); the registered implementations in the submodules take the typed args.
"""
from dsv4ops.ops import OPS
from dsv4ops.platform import VENDORS
from dsv4ops.registry import Backend, register_backend

from . import fp8_einsum, indexer_topk, paged_mqa_logits, qnorm_rope_kv_insert, sparse_mla_decode
from . import sparse_mla_prefill
from . import mqa_logits

from . import inv_rope_fp8_quant

from . import compress_kv_insert

BACKEND = register_backend(Backend("reference", VENDORS, description="PyTorch references (any device)"))
for _module in (compress_kv_insert, inv_rope_fp8_quant, qnorm_rope_kv_insert, sparse_mla_decode, paged_mqa_logits, fp8_einsum, indexer_topk,
                sparse_mla_prefill, mqa_logits):
    _name = _module.__name__.rpartition(".")[2]
    BACKEND.implements(_name, getattr(_module, _name))


def _public(op):
    def reference(*args, **kwargs):
        return op.function(*args, backend="reference", **kwargs)
    reference.__name__ = reference.__qualname__ = op.name
    reference.__signature__ = op.signature
    reference.__doc__ = f"The reference {op.name} (public signature; validated like dsv4ops.{op.name})."
    return reference


qnorm_rope_kv_insert = _public(OPS["qnorm_rope_kv_insert"])
sparse_mla_decode = _public(OPS["sparse_mla_decode"])
paged_mqa_logits = _public(OPS["paged_mqa_logits"])
fp8_einsum = _public(OPS["fp8_einsum"])
indexer_topk = _public(OPS["indexer_topk"])
compress_kv_insert = _public(OPS["compress_kv_insert"])
mqa_logits = _public(OPS["mqa_logits"])
sparse_mla_prefill = _public(OPS["sparse_mla_prefill"])
inv_rope_fp8_quant = _public(OPS["inv_rope_fp8_quant"])

__all__ = ["compress_kv_insert", "inv_rope_fp8_quant", "qnorm_rope_kv_insert", "sparse_mla_decode", "paged_mqa_logits", "fp8_einsum", "indexer_topk",
           "sparse_mla_prefill", "mqa_logits"]
