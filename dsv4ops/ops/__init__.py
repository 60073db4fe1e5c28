"""The op declarations, one module per op (its ``OpSpec``, checks and fake outputs)."""
from . import compress_kv_insert
from . import inv_rope_fp8_quant
from . import fp8_einsum, indexer_topk, paged_mqa_logits, qnorm_rope_kv_insert, sparse_mla_decode
from . import sparse_mla_prefill
from . import mqa_logits

# op name -> its defined Op (spec, typed args, public function, validation)
OPS = {m.OP.name: m.OP for m in (qnorm_rope_kv_insert, sparse_mla_decode, paged_mqa_logits, fp8_einsum,
                                 indexer_topk)}
OPS[inv_rope_fp8_quant.OP.name] = inv_rope_fp8_quant.OP
OPS[sparse_mla_prefill.OP.name] = sparse_mla_prefill.OP
OPS[mqa_logits.OP.name] = mqa_logits.OP
OPS[compress_kv_insert.OP.name] = compress_kv_insert.OP
OP_NAMES = tuple(OPS)

qnorm_rope_kv_insert = OPS["qnorm_rope_kv_insert"].function
sparse_mla_decode = OPS["sparse_mla_decode"].function
paged_mqa_logits = OPS["paged_mqa_logits"].function
fp8_einsum = OPS["fp8_einsum"].function
indexer_topk = OPS["indexer_topk"].function
compress_kv_insert = OPS["compress_kv_insert"].function
mqa_logits = OPS["mqa_logits"].function
sparse_mla_prefill = OPS["sparse_mla_prefill"].function
inv_rope_fp8_quant = OPS["inv_rope_fp8_quant"].function

__all__ = ["OPS", "OP_NAMES", *OP_NAMES]
