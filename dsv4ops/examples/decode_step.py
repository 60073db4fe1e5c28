"""One DeepSeek-V4 C4 attention layer decode step, built only from dsv4ops calls:

    qnorm_rope_kv_insert -> paged_mqa_logits -> indexer_topk -> formats.to_global_indices
    -> sparse_mla_decode (SWA + C4 compressed cache) -> inv_rope_fp8_quant -> fp8_einsum

The indexer stays two calls: ``paged_mqa_topk`` (one call, a bounded workspace) measured no faster at
B=128 and 8K keys (H100: 63.3 µs against 63.4 for the composition; H200: 58.0 against 58.0;
docs/perf/README.md).

Random weights and caches; one token per request (next_n = 1). ``run_step`` runs the pipeline under
a ``DSV4OPS_BACKEND`` setting; ``main`` checks every setting against the all-reference pipeline
and (on a GPU) times the whole step:

    python -m dsv4ops.examples.decode_step --device cuda --settings auto triton reference --time
"""
from __future__ import annotations

import argparse
import functools
import math
from dataclasses import dataclass

import torch

import dsv4ops
from dsv4ops import formats
from dsv4ops.backend_support import interpreter_on_cpu
from dsv4ops.cli import HelpFormatter
from dsv4ops.errors import Dsv4opsError
from dsv4ops.sampling import cos_sin_cache
from dsv4ops.tolerance import calc_diff
from dsv4ops.platform import default_device
from dsv4ops.quant import to_fp8

from .common import (HEADS_PER_GROUP, SWA_BLOCK, backend_setting, describe_times, o_proj_weights, time_us,
                     window_indices)

C4_BLOCK, RATIO = 64, 4


@dataclass
class Layer:
    """Caches, metadata and weights of one C4 layer (docs/ops.md §0 shapes, scaled by the arguments)."""

    q: torch.Tensor                 # bf16 [T, H, 512]   (wq_b output)
    kv: torch.Tensor                # bf16 [T, 512]      (wkv output after kv_norm)
    positions: torch.Tensor         # int64 [T]
    cos_sin: torch.Tensor           # fp32 [max_pos, 64]
    swa_cache: torch.Tensor         # fp8_ds_mla, block 64
    swa_table: torch.Tensor         # int32 [T, pages]
    c4_cache: torch.Tensor          # fp8_ds_mla, block 64 (compressed entries)
    c4_table: torch.Tensor          # int32 [T, pages]
    index_q: torch.Tensor           # fp8 [T, 1, 64, 128]
    index_weights: torch.Tensor     # fp32 [T, 64]
    index_cache: torch.Tensor       # uint8 [blocks, 64, 1, 132]
    attn_sink: torch.Tensor         # fp32 [H]
    wo_a: torch.Tensor              # fp8 [G, o_rank, 4096]
    wo_a_scale: torch.Tensor        # fp32 [G, o_rank/128, 32]
    index_topk: int


def make_layer(T=4, H=64, context=2048, index_topk=512, o_rank=1024, device="cpu", seed=0) -> Layer:
    """``T`` requests, each decoding one token at a random position below ``context``."""
    g = torch.Generator().manual_seed(seed)
    positions = torch.randint(context // 2, context, (T,), generator=g)
    positions[0] = context - 1
    swa_pages = math.ceil(context / SWA_BLOCK)
    c4_pages = math.ceil(context // RATIO / C4_BLOCK) or 1

    def table(pages):           # disjoint random pages per request
        return torch.randperm(T * pages, generator=g)[: T * pages].view(T, pages).to(torch.int32)

    swa_table, c4_table = table(swa_pages), table(c4_pages)
    swa_rows = torch.randn(T * swa_pages * SWA_BLOCK, 512, generator=g) * 0.3
    c4_rows = torch.randn(T * c4_pages * C4_BLOCK, 512, generator=g) * 0.3
    keys = torch.randn(T * c4_pages, C4_BLOCK, 128, generator=g)
    w8, w_scale = o_proj_weights(H // HEADS_PER_GROUP, o_rank, g)
    layer = Layer(
        q=(torch.randn(T, H, 512, generator=g) * 2).to(torch.bfloat16),
        kv=(torch.randn(T, 512, generator=g) * 0.3).to(torch.bfloat16),
        positions=positions, cos_sin=cos_sin_cache(context + 1),
        swa_cache=formats.pack_kv(swa_rows, "fp8_ds_mla", SWA_BLOCK), swa_table=swa_table,
        c4_cache=formats.pack_kv(c4_rows, "fp8_ds_mla", C4_BLOCK), c4_table=c4_table,
        index_q=to_fp8(torch.randn(T, 1, 64, 128, generator=g) * 2),
        index_weights=torch.randn(T, 64, generator=g) * 0.1,
        index_cache=formats.pack_index_keys(keys, "ue8m0"),
        attn_sink=torch.randn(H, generator=g), wo_a=w8, wo_a_scale=w_scale, index_topk=index_topk)
    for name, value in vars(layer).items():
        if isinstance(value, torch.Tensor):
            setattr(layer, name, value.to(device))
    return layer


def run_step(layer: Layer, setting: str = "auto", fresh_cache: bool = True,
             used: dict[str, str] | None = None) -> dict[str, torch.Tensor]:
    """The decode step. The token's KV goes into a copy of the SWA cache (``fresh_cache``, so that
    pipelines compared on one layer read the same bytes) or into the layer's cache itself (timing:
    rewriting the same slot is idempotent for one backend). Returns the main intermediates;
    ``used``, if given, receives op -> the backend that ran it."""
    T = layer.q.shape[0]
    swa_cache = layer.swa_cache.clone() if fresh_cache else layer.swa_cache
    call = functools.partial(_call, used)
    with backend_setting(setting):
        slot, swa_idx, swa_lens = window_indices(layer.positions, layer.swa_table)
        q = call("qnorm_rope_kv_insert", layer.q.clone(), layer.kv, layer.positions, layer.cos_sin, swa_cache, slot,
                 layout="fp8_ds_mla", block_size=SWA_BLOCK)
        ctx = ((layer.positions + 1) // RATIO).to(torch.int32)[:, None]      # compressed entries visible
        width = layer.c4_table.shape[1] * C4_BLOCK
        logits = call("paged_mqa_logits", layer.index_q, layer.index_cache, layer.index_weights, ctx, layer.c4_table,
                      width)
        local = call("indexer_topk", logits, layer.index_topk, seq_lens=ctx)
        c4_idx, c4_lens = formats.to_global_indices(local, layer.c4_table, torch.arange(T, device=q.device), C4_BLOCK)
        out, _ = call("sparse_mla_decode", q, swa_cache, swa_idx, swa_lens, layout="fp8_ds_mla", block_size=SWA_BLOCK,
                      softmax_scale=512 ** -0.5, attn_sink=layer.attn_sink, extra_kv_cache=layer.c4_cache,
                      extra_indices=c4_idx, extra_topk_lens=c4_lens, extra_block_size=C4_BLOCK, need_lse=False)
        a, a_scale = call("inv_rope_fp8_quant", out, layer.positions, layer.cos_sin, n_groups=layer.wo_a.shape[0])
        z = call("fp8_einsum", "bhr,hdr->bhd", a, a_scale, layer.wo_a, layer.wo_a_scale)
    return dict(q=q, logits=logits, topk=local, attn=out, z=z)


def _call(used: dict[str, str] | None, op: str, *args, **kwargs):
    """``dsv4ops.<op>(*args, **kwargs)``; with ``used``, first records which backend serves it."""
    if used is not None:
        used[op] = dsv4ops.explain(op, *args, **kwargs).backend
    return getattr(dsv4ops, op)(*args, **kwargs)


def compare_to_reference(layer: Layer, setting: str) -> dict:
    """End-to-end agreement with the all-reference pipeline: calc_diff of the attention output and
    of z, the overlap of the top-k sets (near-ties may be broken differently), and ``backends``:
    op -> the backend that ran it under ``setting``."""
    used: dict[str, str] = {}
    ref, got = run_step(layer, "reference"), run_step(layer, setting, used=used)
    overlap = []
    for r, g in zip(ref["topk"].tolist(), got["topk"].tolist()):
        rs, gs = {x for x in r if x >= 0}, {x for x in g if x >= 0}
        overlap.append(len(rs & gs) / max(len(rs), 1))
    return dict(attn_diff=calc_diff(got["attn"], ref["attn"]), z_diff=calc_diff(got["z"], ref["z"]),
                topk_overlap=min(overlap), backends=used)


def describe_backends(used: dict[str, str]) -> str:
    """Which backend ran which ops, e.g. ``triton: 5 ops; reference: indexer_topk``."""
    by_backend: dict[str, list[str]] = {}
    for op, backend in used.items():
        by_backend.setdefault(backend, []).append(op)
    if set(by_backend) == {"reference"}:
        return "every op ran on the reference: this compares the reference with itself"
    return "; ".join(f"{backend}: " + (f"{len(ops)} ops" if len(ops) > 2 else ", ".join(ops))
                     for backend, ops in by_backend.items())


def time_step(layer: Layer, setting: str) -> str:
    """The step's median time, eagerly and (not for the reference) as a replayed CUDA graph."""
    return describe_times(*time_us(lambda: run_step(layer, setting, fresh_cache=False), graph=setting != "reference"))


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                     formatter_class=HelpFormatter)
    parser.add_argument("--device", default=str(default_device()), help="torch device of the layer's tensors")
    parser.add_argument("--tokens", type=int, default=4, help="decode tokens T in the step")
    parser.add_argument("--heads", type=int, default=64, help="attention heads H")
    parser.add_argument("--context", type=int, default=2048, help="tokens already in each request's cache")
    parser.add_argument("--index-topk", type=int, default=512, help="compressed entries the indexer selects")
    parser.add_argument("--settings", nargs="+", default=["auto"],
                        help="backend choices to compare with the reference: 'auto' or DSV4OPS_BACKEND values")
    parser.add_argument("--time", action="store_true", help="time the whole step per setting (GPU)")
    args = parser.parse_args(argv)
    interpreter_on_cpu(torch.device(args.device), "dsv4ops.examples.decode_step")
    layer = make_layer(T=args.tokens, H=args.heads, context=args.context, index_topk=args.index_topk,
                       device=args.device)
    worst = 0.0
    for setting in args.settings:
        try:
            result = compare_to_reference(layer, setting)
        except Dsv4opsError as exc:                 # e.g. a setting no backend here can serve: report, go on
            print(f"{setting:40s} error: {type(exc).__name__}: {exc}", flush=True)
            worst = math.inf
            continue
        line = f"{setting:40s} attn calc_diff {result['attn_diff']:.2e}  z calc_diff {result['z_diff']:.2e}  " \
               f"top-k overlap {result['topk_overlap']:.4f}"
        if args.time:
            line += "  " + time_step(layer, setting)
        print(line + f"\n{'':40s} backends: {describe_backends(result['backends'])}", flush=True)
        worst = max(worst, result["z_diff"])
    return 0 if worst < 1e-3 else 1


if __name__ == "__main__":
    raise SystemExit(main())
