"""The five op contracts: argument validation and the public entry points (one module per op)."""
import importlib

OP_NAMES = ("qnorm_rope_kv_insert", "sparse_mla_decode", "paged_mqa_logits", "fp8_einsum", "indexer_topk")
# op name -> its module (NAME, validate, and the public function of the same name)
OPS = {name: importlib.import_module(f"{__name__}.{name}") for name in OP_NAMES}

qnorm_rope_kv_insert = OPS["qnorm_rope_kv_insert"].qnorm_rope_kv_insert
sparse_mla_decode = OPS["sparse_mla_decode"].sparse_mla_decode
paged_mqa_logits = OPS["paged_mqa_logits"].paged_mqa_logits
fp8_einsum = OPS["fp8_einsum"].fp8_einsum
indexer_topk = OPS["indexer_topk"].indexer_topk

__all__ = ["OPS", "OP_NAMES", *OP_NAMES]
