"""Run each Triton kernel at a production shape twice (warm-up, then the profiled launch), for
``ncu`` (see tools/profile.sh). Usage: [OPS=op,op] python tools/profile_triton.py; with
``DSV4OPS_TRITON_TUNING=fp8_path=soft`` the software fp8 path runs."""
import os

import torch

import dsv4ops
from dsv4ops.conformance.cases import make_case

CASES = [
    make_case("sparse_mla_decode", "full", T=128, H=128, topk=128, layout="fp8_ds_mla", extra_topk=1024,
          extra_block_size=64, lens="full"),
    make_case("paged_mqa_logits", "full", B=64, next_n=2, context=8192, H=64, block_size=64),
    make_case("paged_mqa_topk", "full", B=128, next_n=1, context=8192, H=64, block_size=64, topk=512),
    make_case("fp8_einsum", "full", B=1024, H=8, D=1024, R=4096),
    make_case("indexer_topk", "full", R=128, W=32768, k=512, mode="decode2d"),
    make_case("qnorm_rope_kv_insert", "full", T=128, H=64, layout="fp8_ds_mla", block_size=64, num_blocks=8),
    make_case("inv_rope_fp8_quant", "full", T=4096, H=64, n_groups=8),
    *(make_case("compress_kv_insert", "full", layout=layout, ratio=ratio, reqs=((0, 8192),), block_size=block_size)
      for layout, ratio, block_size in (("fp8_ds_mla", 4, 64), ("fp8_ds_mla", 128, 2), ("index_fp8", 4, 64))),
]

only = set(filter(None, os.environ.get("OPS", "").split(",")))
for case in CASES:
    if only and case.op not in only:
        continue
    kwargs = case.build("cuda", seed=0)
    for _ in range(2):
        dsv4ops.dispatch(case.op, **kwargs, backend="triton")
    torch.cuda.synchronize()
    print("ran", case.id, flush=True)
