"""``dsv4ops bench``: time every available backend per op on the anchor shapes of
``shared/spec/perf-anchors.md`` (CUDA events, median of do_bench), with a bytes model per case."""
from __future__ import annotations

import json

import torch

from . import ops
from .conformance.cases import Case, _case
from .selection import decide

ANCHORS = [
    _case("sparse_mla_decode", "full", T=8, H=64, topk=128, layout="fp8_ds_mla", extra_topk=128, extra_block_size=64),
    _case("sparse_mla_decode", "full", T=128, H=64, topk=128, layout="fp8_ds_mla", extra_topk=512, extra_block_size=64),
    _case("sparse_mla_decode", "full", T=128, H=128, topk=128, layout="fp8_ds_mla", extra_topk=1024,
          extra_block_size=64),
    _case("sparse_mla_decode", "full", T=512, H=64, topk=128, layout="fp8_ds_mla", extra_topk=512, extra_block_size=64),
    _case("paged_mqa_logits", "full", B=128, next_n=1, context=8192, H=64, block_size=64),
    _case("indexer_topk", "full", R=128, W=32768, k=512, mode="decode2d", next_n=1),
    _case("fp8_einsum", "full", B=1024, H=8, D=1024, R=4096),
    _case("fp8_einsum", "full", B=128, H=8, D=1024, R=4096),
    _case("qnorm_rope_kv_insert", "full", T=128, H=64, layout="fp8_ds_mla", block_size=64, num_blocks=8),
]


def bench(case_list: list[Case], backend_names: list[str], device) -> list[dict]:
    import triton.testing

    rows = []
    for case in case_list:
        kwargs = case.build(device, seed=0)
        module = ops.OPS[case.op]
        for name in backend_names:
            decision = decide(module.validate(**kwargs), name)
            if decision.selected is None:
                rows.append(dict(op=case.op, case=case.id, backend=name, us=None,
                                 skipped=next((c.status for c in decision.candidates if c.backend == name), "n/a")))
                continue
            fn = decision.selected.fn
            ms = triton.testing.do_bench(lambda: fn(**kwargs), warmup=25, rep=200, return_mode="median")
            rows.append(dict(op=case.op, case=case.id, backend=name, us=round(ms * 1000, 2)))
            print(f"{case.id:100s} {name:10s} {ms * 1000:10.1f} us", flush=True)
    return rows


def main(args) -> int:
    from .platform import default_device, platform

    device = default_device()
    names = args.backends.split(",") if args.backends else ["triton", "flashmla", "deepgemm", "flashinfer"]
    case_list = [c for c in ANCHORS if not args.ops or c.op in args.ops.split(",")]
    rows = bench(case_list, names, device)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(dict(platform=str(platform(device)), libraries=dict(platform(device).libraries), results=rows),
                      f, indent=1)
    return 0
