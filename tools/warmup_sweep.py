"""After ``dsv4ops.warmup``, shape sweeps of every op compile nothing and stall nothing (issue #31).

    python tools/warmup_sweep.py OUT.json [--max-context 524288] [--max-tokens 8192] [--next-n 1]

On one GPU, with no network: a fresh TRITON_CACHE_DIR (a temporary folder, removed at the end),
``dsv4ops.warmup`` for V4-Flash TP1 with these limits, then per op a sweep of shapes within them
(the issue's table; fp8_einsum also at a few hundred B spread up to max_tokens, where DeepGEMM's
JIT picks its kernel; the two-level indexer's ops at V4.1 sizes), each call through automatic
selection. Counts the Triton compiles after the warm-up (``dsv4ops.jit_monitor`` in ``count``
mode, per op and kernel) and the calls slower than 5 ms (with the same call's second time, so a
slow kernel is told from a stall). Prints a summary and writes everything to OUT.json; exits 1 if
any sweep compiled or stalled.
"""
from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import sys
import tempfile
import time

STALL_MS = 5.0


def einsum_sizes(max_tokens: int, count: int = 300) -> list[int]:
    """B = 1..20, one B drawn (a fixed seed) from each of ``count`` equal bins of (20, max_tokens], and
    max_tokens: mostly not powers of two, spread over the range."""
    rng, lo, span = random.Random(31), 21, max_tokens - 20
    spread = {rng.randrange(lo + i * span // count, lo + (i + 1) * span // count)
              for i in range(count) if (i + 1) * span // count > i * span // count}
    return sorted({*range(1, min(20, max_tokens) + 1), *spread, max_tokens})


def sweeps(dims, lim) -> dict[str, list[dict]]:
    """Builder parameters (each op's conformance inputs) of the issue's sweeps for the model ``dims``
    within the engine limits ``lim`` (``dsv4ops.deployment``; the two-level indexer's ops: V4.1's
    heads, candidate blocks and both index key layouts). The sweeps are this tool's own, independent
    of the warm-up declarations they check."""
    heads, o_groups, W_, k, ih = dims.heads, dims.o_groups, dims.window, dims.index_topk, dims.index_heads
    next_n, max_width, max_tokens, swa_block, c4_block = (lim.next_n, lim.index_width, lim.max_tokens, lim.swa_block,
                                                          lim.c4_block)
    blocks = dict(sparse_block=dims.candidate_block, num_blocks=dims.candidate_blocks)
    attention = dict(H=heads, topk=W_, layout="fp8_ds_mla", block_size=swa_block, extra_topk=k,
                     extra_block_size=c4_block)
    grow = [int(1024 * 1.25 ** i) for i in range(40) if 1024 * 1.25 ** i <= max_width]
    return {
        "qnorm_rope_kv_insert": [dict(T=T, H=heads, layout="fp8_ds_mla", block_size=swa_block, num_blocks=4)
                                 for T in range(1, 41)],
        "sparse_mla_decode": [dict(T=T, **attention) for T in range(1, 41)],
        "sparse_mla_prefill": [dict(T=T, **attention) for T in range(1, 514, 27)],
        "paged_mqa_logits": [dict(B=B, next_n=next_n, context=c, H=ih, block_size=c4_block)
                             for B, c in zip(range(1, 41), range(256, 4001, 96))],
        "mqa_logits": [dict(T=T, S=S, H=ih) for T, S in zip(range(1, 31), range(64, 4097, 139))],
        "fp8_einsum": [dict(B=B, H=o_groups, D=dims.o_lora_rank, R=dims.o_group_k, group_major=True)
                       for B in sorted({*range(32, 1025, 53), *einsum_sizes(max_tokens)})],
        "indexer_topk": ([dict(R=R, W=w, k=k, mode="decode2d", next_n=1)
                          for R, w in zip(range(1, 41), range(1024, 32769, 813))]
                         + [dict(R=4, W=w, k=k, mode="decode2d", next_n=1) for w in range(20000, 20041)]
                         + [dict(R=4, W=w, k=k, mode="decode2d", next_n=1) for w in grow]),
        "compress_kv_insert": [dict(layout="fp8_ds_mla", ratio=4, block_size=c4_block, reqs=((64, t),))
                               for t in range(1, 41)],
        "inv_rope_fp8_quant": [dict(T=T, H=heads, n_groups=o_groups) for T in range(1, 41)],
        "mqa_topk": [dict(T=T, S=S, H=ih, topk=k) for T, S in zip(range(1, 31), range(k, 4097, 123))],
        "paged_mqa_topk": [dict(B=B, next_n=next_n, context=c, H=ih, block_size=c4_block, topk=k)
                           for B, c in zip(range(1, 41), range(600, 4001, 87))],
        "candidate_blocks": ([dict(R=R, W=w, mode="ranges", **blocks)
                              for R, w in zip(range(1, 41), range(1024, 32769, 813))]
                             + [dict(R=4 * next_n, W=w, mode="decode2d", next_n=next_n, **blocks)
                                for w in range(20000, 20041)]),
        "sparse_mqa_logits": [dict(T=T, S=S, H=dims.v41_index_heads, clean=T % 2 == 0, **blocks)
                              for T, S in zip(range(1, 31), range(64, 4097, 139))],
        "paged_sparse_mqa_logits": [dict(B=B, next_n=next_n, context=c, H=dims.v41_index_heads,
                                         block_size=c4_block, layout=lay, **blocks)
                                    for B, c in zip(range(1, 41), range(256, 4001, 96))
                                    for lay in ("index_fp8", "index_mxfp4")],
    }


def sized_calls(op: str, calls: list[dict], device, gen):
    """Keyword arguments of each call. An op with a leading size (fp8_einsum's B) is built once, small,
    grown to the sweep's largest B (``warm_up.grown``) and cut per call (``OpSpec.at_size``): building
    every B up to 8192 on the host would take minutes."""
    from dsv4ops.ops import OPS
    from dsv4ops.warm_up import grown

    spec = OPS[op].spec
    if not spec.leading:
        for params in calls:
            yield params, spec.conformance.inputs(device, gen, **params)
        return
    largest = max(p["B"] for p in calls)
    small = OPS[op].validate_call(**spec.conformance.inputs(device, gen, **dict(calls[0], B=min(4, largest))))
    full = grown(op, small.args, largest)
    for params in calls:
        yield params, spec.at_size(full, params["B"])._asdict()


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
    from dsv4ops.deployment import engine_limits, model_dims

    if not torch.cuda.is_available():
        print("tools/warmup_sweep.py needs a CUDA GPU", file=sys.stderr)
        return 2
    device = torch.device("cuda", torch.cuda.current_device())
    limits = dict(max_tokens=args.max_tokens, max_context=args.max_context, next_n=args.next_n)
    dims, lim = model_dims("v4-flash", 1), engine_limits(**limits)
    start = time.perf_counter()
    summary = dsv4ops.warmup(model="v4-flash", tp=1, limits=limits, device=device)
    warmup_s = time.perf_counter() - start
    print(summary, flush=True)
    jit_monitor.set_mode("count")
    jit_monitor.clear()
    gen = torch.Generator().manual_seed(0)
    report = dict(device=torch.cuda.get_device_name(device), platform=str(dsv4ops.platform(device)),
                  libraries=dict(dsv4ops.platform(device).libraries), limits=limits, warmup_s=warmup_s,
                  warmup_variants=len(summary.variants), cache_dir=cache, sweeps={})
    failed = False
    for op, calls in sweeps(dims, lim).items():
        before = len(jit_monitor.compiles())
        rows = []
        for params, kwargs in sized_calls(op, calls, device, gen):
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
    print(f"warm-up {warmup_s:.1f} s, {len(summary.variants)} variants compiled; "
          f"{'FAILED: compiles or stalls after warm-up' if failed else 'no compile and no stall after warm-up'}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
