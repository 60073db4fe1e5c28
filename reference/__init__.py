"""The PyTorch references: one function per op, the definition of correct for every backend.

They compute in fp32 (fp64 for the einsum) from exactly the bytes a kernel would read, round only
where the spec says, and run on any device. Registered as the backend ``reference`` (lowest priority).
"""
from dsv4ops.platform import VENDORS
from dsv4ops.registry import Backend, register_backend

from .fp8_einsum import fp8_einsum
from .indexer_topk import indexer_topk
from .paged_mqa_logits import paged_mqa_logits
from .qnorm_rope_kv_insert import qnorm_rope_kv_insert
from .sparse_mla_decode import sparse_mla_decode

BACKEND = register_backend(Backend("reference", VENDORS, description="PyTorch references (any device)"))
for _fn in (qnorm_rope_kv_insert, sparse_mla_decode, paged_mqa_logits, fp8_einsum, indexer_topk):
    BACKEND.implements(_fn.__name__, _fn, priority=0)

__all__ = ["qnorm_rope_kv_insert", "sparse_mla_decode", "paged_mqa_logits", "fp8_einsum", "indexer_topk"]
