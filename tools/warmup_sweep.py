"""After ``dsv4ops.warmup``, shape sweeps of every op compile nothing and stall nothing (issue #31).

    python tools/warmup_sweep.py OUT.json [--max-context 524288] [--max-tokens 8192] [--next-n 1]

On one GPU, with no network: a fresh TRITON_CACHE_DIR (a temporary folder, removed at the end),
``dsv4ops.warmup`` for V4-Flash TP1 with these limits, then per op a sweep of shapes within them
(the issue's table), each call through automatic selection. Counts the Triton compiles after the
warm-up (``dsv4ops.jit_monitor`` in ``count`` mode, per op and kernel) and the calls slower than
5 ms (with the same call's second time, so a slow kernel is told from a stall). Prints a summary
and writes everything to OUT.json; exits 1 if any sweep compiled or stalled.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time

STALL_MS = 5.0


def sweeps(index_topk: int, heads: int, o_groups: int, next_n: int, max_width: int) -> dict[str, list[dict]]:
    """Builder parameters (each op's conformance inputs) of the issue's sweeps, at V4-Flash TP1 sizes."""
    from dsv4ops import shapes

    W_, k, ih = shapes.WINDOW, index_topk, shapes.INDEX_HEADS
    attention = dict(H=heads, topk=W_, layout="fp8_ds_mla", block_size=shapes.SWA_BLOCK, extra_topk=k,
                     extra_block_size=shapes.C4_BLOCK)
    grow = [int(1024 * 1.25 ** i) for i in range(40) if 1024 * 1.25 ** i <= max_width]
    return {
        "qnorm_rope_kv_insert": [dict(T=T, H=heads, layout="fp8_ds_mla", block_size=shapes.SWA_BLOCK, num_blocks=4)
                                 for T in range(1, 41)],
        "sparse_mla_decode": [dict(T=T, **attention) for T in range(1, 41)],
        "sparse_mla_prefill": [dict(T=T, **attention) for T in range(1, 514, 27)],
        "paged_mqa_logits": [dict(B=B, next_n=next_n, context=c, H=ih, block_size=shapes.C4_BLOCK)
                             for B, c in zip(range(1, 41), range(256, 4001, 96))],
        "mqa_logits": [dict(T=T, S=S, H=ih) for T, S in zip(range(1, 31), range(64, 4097, 139))],
        "fp8_einsum": [dict(B=B, H=o_groups, D=shapes.O_LORA_RANK, R=shapes.O_GROUP_K, group_major=True)
                       for B in sorted({*range(1, 21), *range(32, 1025, 53), 1024})],
        "indexer_topk": ([dict(R=R, W=w, k=k, mode="decode2d", next_n=1)
                          for R, w in zip(range(1, 41), range(1024, 32769, 813))]
                         + [dict(R=4, W=w, k=k, mode="decode2d", next_n=1) for w in range(20000, 20041)]
                         + [dict(R=4, W=w, k=k, mode="decode2d", next_n=1) for w in grow]),
        "compress_kv_insert": [dict(layout="fp8_ds_mla", ratio=4, block_size=shapes.C4_BLOCK, reqs=((64, t),))
                               for t in range(1, 41)],
        "inv_rope_fp8_quant": [dict(T=T, H=heads, n_groups=o_groups) for T in range(1, 41)],
        "mqa_topk": [dict(T=T, S=S, H=ih, topk=k) for T, S in zip(range(1, 31), range(k, 4097, 123))],
        "paged_mqa_topk": [dict(B=B, next_n=next_n, context=c, H=ih, block_size=shapes.C4_BLOCK, topk=k)
                           for B, c in zip(range(1, 41), range(600, 4001, 87))],
    }


def main(argv) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", help="the JSON file to write")
    parser.add_argument("--max-tokens", type=int, default=8192)
    parser.add_argument("--max-context", type=int, default=524288, help="tokens (the indexer's rows: a quarter)")
    parser.add_argument("--next-n", type=int, default=1)
    args = parser.parse_args(argv)
    out = open(args.out, "w")                    # a bad path fails before anything runs
    cache = tempfile.mkdtemp(prefix="dsv4ops-warmup-sweep-")
    os.environ["TRITON_CACHE_DIR"] = cache       # before Triton is imported: a fresh cache
    os.environ.pop("TRITON_INTERPRET", None)
    try:
        return run(args, out, cache)
    finally:
        shutil.rmtree(cache, ignore_errors=True)


def run(args, out, cache: str) -> int:
    import torch

    import dsv4ops
    from dsv4ops import jit_monitor
    from dsv4ops.ops import OPS
    from dsv4ops.warm_up import engine_limits, model_dims

    if not torch.cuda.is_available():
        print("tools/warmup_sweep.py needs a CUDA GPU", file=sys.stderr)
        return 2
    device = torch.device("cuda", torch.cuda.current_device())
    limits = dict(max_tokens=args.max_tokens, max_context=args.max_context, next_n=args.next_n)
    dims = model_dims("v4-flash", 1)
    start = time.perf_counter()
    summary = dsv4ops.warmup(model="v4-flash", tp=1, limits=limits, device=device)
    warmup_s = time.perf_counter() - start
    print(summary, flush=True)
    jit_monitor.set_mode("count")
    jit_monitor.clear()
    gen = torch.Generator().manual_seed(0)
    width = engine_limits(**limits).index_width
    report = dict(device=torch.cuda.get_device_name(device), platform=str(dsv4ops.platform(device)),
                  libraries=dict(dsv4ops.platform(device).libraries), limits=limits, warmup_s=warmup_s,
                  warmup_variants=len(summary.variants), cache_dir=cache, sweeps={})
    failed = False
    for op, calls in sweeps(dims.index_topk, dims.heads, dims.o_groups, args.next_n, width).items():
        before = len(jit_monitor.compiles())
        rows = []
        for params in calls:
            kwargs = OPS[op].spec.conformance.inputs(device, gen, **params)
            times = []
            for _ in range(2):
                torch.cuda.synchronize(device)
                t0 = time.perf_counter()
                OPS[op].function(**kwargs)
                torch.cuda.synchronize(device)
                times.append((time.perf_counter() - t0) * 1e3)
            rows.append(dict(params={k: v for k, v in params.items() if isinstance(v, (int, str))},
                             first_ms=times[0], second_ms=times[1],
                             backend=dsv4ops.explain(op, **kwargs).backend))
        compiles = [str(e) for e in jit_monitor.compiles()[before:]]
        stalls = [r for r in rows if r["first_ms"] > STALL_MS]
        failed |= bool(compiles or stalls)
        report["sweeps"][op] = dict(shapes=len(rows), compiles=compiles, stalls=stalls,
                                    max_first_ms=max(r["first_ms"] for r in rows),
                                    backends=sorted({r["backend"] or "-" for r in rows}), calls=rows)
        print(f"{op:22s} shapes {len(rows):3d}  compiles {len(compiles):2d}  calls > {STALL_MS:g} ms {len(stalls):2d}  "
              f"max first call {report['sweeps'][op]['max_first_ms']:8.2f} ms  "
              f"({', '.join(report['sweeps'][op]['backends'])})", flush=True)
    json.dump(report, out, indent=1)
    out.close()
    print(f"warm-up {warmup_s:.1f} s, {len(summary.variants)} Triton variants; "
          f"{'FAILED: compiles or stalls after warm-up' if failed else 'no compile and no stall after warm-up'}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
