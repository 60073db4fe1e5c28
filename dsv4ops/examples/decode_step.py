"""One DeepSeek-V4 C4 attention layer decode step, built only from dsv4ops calls:

    qnorm_rope_kv_insert -> paged_mqa_logits -> indexer_topk -> formats.to_global_indices
    -> sparse_mla_decode (SWA + C4 compressed cache) -> inverse RoPE + FP8 quantize -> fp8_einsum

Random weights and caches; one token per request (next_n = 1). ``run_step`` runs the pipeline under
a ``DSV4OPS_BACKEND`` setting; ``main`` checks every setting against the all-reference pipeline
and (on a GPU) times the whole step:

    python -m dsv4ops.examples.decode_step --device cuda --settings auto triton reference --time
"""
from __future__ import annotations

import argparse
import contextlib
import math
import os
from dataclasses import dataclass

import torch

import dsv4ops
from dsv4ops import formats, settings
from dsv4ops.conformance.compare import calc_diff
from dsv4ops.conformance.inputs import cos_sin_cache
from dsv4ops.platform import default_device
from dsv4ops.quant import to_fp8, ue8m0_scale

WINDOW, SWA_BLOCK, C4_BLOCK, RATIO, HEADS_PER_GROUP = 128, 64, 64, 4, 8


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
    G = H // HEADS_PER_GROUP
    w = torch.randn(G, o_rank, HEADS_PER_GROUP * 512, generator=g) * 0.02
    blocks = w.view(G, o_rank // 128, 128, -1, 128)
    w_scale = ue8m0_scale(blocks.abs().amax(dim=(2, 4)).clamp_min(1e-4))[0]
    w8 = to_fp8(blocks / w_scale[:, :, None, :, None]).view(G, o_rank, -1)
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


def swa_indices(layer: Layer) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """This token's slot, and its window [max(p - 127, 0), p] as cache indices + lengths (vLLM's rule)."""
    p = layer.positions
    start = (p - (WINDOW - 1)).clamp_min(0)
    j = torch.arange(WINDOW, device=p.device)
    tok = start[:, None] + j[None, :]
    valid = tok <= p[:, None]
    pages = torch.gather(layer.swa_table.long(), 1, (tok // SWA_BLOCK).clamp(max=layer.swa_table.shape[1] - 1))
    idx = torch.where(valid, pages * SWA_BLOCK + tok % SWA_BLOCK, -1).to(torch.int32)
    slot = layer.swa_table.long().gather(1, (p // SWA_BLOCK)[:, None])[:, 0] * SWA_BLOCK + p % SWA_BLOCK
    return slot, idx, valid.sum(1, dtype=torch.int32)


def inverse_rope_quant(o: torch.Tensor, layer: Layer) -> tuple[torch.Tensor, torch.Tensor]:
    """Spec §4: undo RoPE on dims 448..511, group 8 heads, quantize 1x128 blocks (eps 1e-10)."""
    T, H, _ = o.shape
    cs = layer.cos_sin[layer.positions]
    c, s = cs[:, None, :32], cs[:, None, 32:]
    x = o.float()
    e, od = x[..., 448::2], x[..., 449::2]
    rot = torch.stack([e * c + od * s, od * c - e * s], dim=-1).flatten(-2)
    x = torch.cat([x[..., :448], rot], dim=-1).view(T, H // HEADS_PER_GROUP, -1)
    blocks = x.view(T, x.shape[1], -1, 128)
    scale = ue8m0_scale(blocks.abs().amax(-1).clamp_min(1e-10))[0]
    return to_fp8(blocks / scale[..., None]).view_as(x), scale


@contextlib.contextmanager
def backend_setting(setting: str):
    """``"auto"`` clears DSV4OPS_BACKEND; anything else is used as its value (the settings are
    re-read on entry and exit: dsv4ops reads the environment once, not per call)."""
    old = os.environ.pop("DSV4OPS_BACKEND", None)
    if setting != "auto":
        os.environ["DSV4OPS_BACKEND"] = setting
    settings.reload()
    try:
        yield
    finally:
        os.environ.pop("DSV4OPS_BACKEND", None)
        if old is not None:
            os.environ["DSV4OPS_BACKEND"] = old
        settings.reload()


def run_step(layer: Layer, setting: str = "auto", fresh_cache: bool = True) -> dict[str, torch.Tensor]:
    """The decode step. The token's KV goes into a copy of the SWA cache (``fresh_cache``, so that
    pipelines compared on one layer read the same bytes) or into the layer's cache itself (timing:
    rewriting the same slot is idempotent for one backend). Returns the main intermediates."""
    T = layer.q.shape[0]
    swa_cache = layer.swa_cache.clone() if fresh_cache else layer.swa_cache
    with backend_setting(setting):
        slot, swa_idx, swa_lens = swa_indices(layer)
        q = dsv4ops.qnorm_rope_kv_insert(layer.q.clone(), layer.kv, layer.positions, layer.cos_sin, swa_cache, slot,
                                         layout="fp8_ds_mla", block_size=SWA_BLOCK)
        ctx = ((layer.positions + 1) // RATIO).to(torch.int32)[:, None]      # compressed entries visible
        width = layer.c4_table.shape[1] * C4_BLOCK
        logits = dsv4ops.paged_mqa_logits(layer.index_q, layer.index_cache, layer.index_weights, ctx,
                                          layer.c4_table, width)
        local = dsv4ops.indexer_topk(logits, layer.index_topk, seq_lens=ctx)
        c4_idx, c4_lens = formats.to_global_indices(local, layer.c4_table, torch.arange(T, device=q.device), C4_BLOCK)
        out, _ = dsv4ops.sparse_mla_decode(q, swa_cache, swa_idx, swa_lens, layout="fp8_ds_mla", block_size=SWA_BLOCK,
                                           softmax_scale=512 ** -0.5, attn_sink=layer.attn_sink,
                                           extra_kv_cache=layer.c4_cache, extra_indices=c4_idx,
                                           extra_topk_lens=c4_lens, extra_block_size=C4_BLOCK, need_lse=False)
        a, a_scale = inverse_rope_quant(out, layer)
        z = dsv4ops.fp8_einsum("bhr,hdr->bhd", a, a_scale, layer.wo_a, layer.wo_a_scale)
    return dict(q=q, logits=logits, topk=local, attn=out, z=z)


def compare_to_reference(layer: Layer, setting: str) -> dict[str, float]:
    """End-to-end agreement with the all-reference pipeline: calc_diff of the attention output and
    of z, and the overlap of the top-k sets (near-ties may be broken differently)."""
    ref, got = run_step(layer, "reference"), run_step(layer, setting)
    overlap = []
    for r, g in zip(ref["topk"].tolist(), got["topk"].tolist()):
        rs, gs = {x for x in r if x >= 0}, {x for x in g if x >= 0}
        overlap.append(len(rs & gs) / max(len(rs), 1))
    return dict(attn_diff=calc_diff(got["attn"], ref["attn"]), z_diff=calc_diff(got["z"], ref["z"]),
                topk_overlap=min(overlap))


def time_step(layer: Layer, setting: str) -> str:
    """Median µs of the step run eagerly (host overhead included) and as a replayed CUDA graph
    (the reference is not capturable: it indexes with boolean masks, which synchronise)."""
    import triton.testing

    step = lambda: run_step(layer, setting, fresh_cache=False)
    eager = triton.testing.do_bench(step, warmup=25, rep=200, return_mode="median")
    if setting == "reference":
        return f"eager {eager * 1000:.1f} us"
    step()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        step()
    replay = triton.testing.do_bench(graph.replay, warmup=25, rep=200, return_mode="median")
    return f"eager {eager * 1000:.1f} us  graph replay {replay * 1000:.1f} us"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--device", default=str(default_device()), help="torch device of the layer's tensors")
    parser.add_argument("--tokens", type=int, default=4, help="decode tokens T in the step")
    parser.add_argument("--heads", type=int, default=64, help="attention heads H")
    parser.add_argument("--context", type=int, default=2048, help="tokens already in each request's cache")
    parser.add_argument("--index-topk", type=int, default=512, help="compressed entries the indexer selects")
    parser.add_argument("--settings", nargs="+", default=["auto"],
                        help="backend choices to compare with the reference: 'auto' or DSV4OPS_BACKEND values")
    parser.add_argument("--time", action="store_true", help="time the whole step per setting (GPU)")
    args = parser.parse_args(argv)
    layer = make_layer(T=args.tokens, H=args.heads, context=args.context, index_topk=args.index_topk,
                       device=args.device)
    worst = 0.0
    for setting in args.settings:
        result = compare_to_reference(layer, setting)
        line = f"{setting:40s} attn calc_diff {result['attn_diff']:.2e}  z calc_diff {result['z_diff']:.2e}  " \
               f"top-k overlap {result['topk_overlap']:.4f}"
        if args.time:
            line += "  " + time_step(layer, setting)
        print(line, flush=True)
        worst = max(worst, result["z_diff"])
    return 0 if worst < 1e-3 else 1


if __name__ == "__main__":
    raise SystemExit(main())
