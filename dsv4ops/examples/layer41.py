"""A DeepSeek-V4.1 attention stack through dsv4ops: chunked prefill, then decode steps that verify a
DSpark block of tokens per request, over four layers that share caches as V4.1-Flash's do:

    "L2"  ratio 2, owns its compressor and a dense indexer (V4.1-Flash layers 2, 8, 14)
    "L3"  ratio 2, reads L2's compressed cache and reuses L2's top-k (the layers between them)
    "L20" ratio 1, owns its compressor and a dense indexer, and publishes candidate blocks
    "L24" ratio 1, reads L20's compressed cache and index keys, scores only inside L20's
          candidate blocks (the two-level indexer's consumers: layers 24, 28, 32, 36)

An owner's step: qnorm_rope_kv_insert (528 B ``mxfp8_v41`` SWA cache) -> compress_kv_insert (ratio 2 or 1,
288 B ``nvfp4_v41`` compressed cache, the bf16 latent out) -> engine: ``wk(latent)`` ->
compress_kv_insert (ratio 1 over 128 dims: k_norm, RoPE, 68 B ``index_mxfp4`` keys) ->
paged_mqa_logits (32 heads) -> indexer_topk [L20: candidate_blocks] -> sparse_mla_prefill / decode
(528 B main + 288 B extra) -> inv_rope_fp8_quant (32-wide blocks) -> fp8_einsum (32 x 32 weights).
L24 replaces the dense logits by paged_sparse_mqa_logits over L20's candidates, then maps its
top-k back to positions (``formats.candidate_positions``). The indexer runs in the paged form for
every step (prefill tokens as rows of one token, decode as ``verify`` rows per request).

Projections are random per step, as in ``layer.py``, whose ``Runner`` judges every call against
the reference; ``compare`` checks the stack's outputs and caches against the all-reference run:

    python -m dsv4ops.examples.layer41 --device cuda --settings auto triton --time
"""
from __future__ import annotations

import argparse
import math
from dataclasses import dataclass, field
from types import SimpleNamespace

import torch

from dsv4ops import formats
from dsv4ops.backend_support import interpreter_on_cpu
from dsv4ops.cli import HelpFormatter
from dsv4ops.platform import default_device
from dsv4ops.quant import to_fp8
from dsv4ops.sampling import cos_sin_cache, quantize_blocks
from dsv4ops.tolerance import calc_diff

from .common import HEADS_PER_GROUP, backend_setting, describe_times, time_us, window_indices
from .layer import MAX_ATTN_DIFF, MAX_CACHE_DIFF, MAX_Z_DIFF, MIN_TOPK_OVERLAP, Runner, Step, entry_slots, schedule
from .layer import _selection_agreement as selection_agreement

BLOCK = 64                       # page size of every cache (SWA, compressed, index keys, state)
EPS = 1e-20                      # V4.1's rms_norm_eps
SOFTMAX_SCALE = 512 ** -0.5
MAIN, EXTRA, KEYS = "mxfp8_v41", "nvfp4_v41", "index_mxfp4"


@dataclass(frozen=True)
class Sizes:
    prompts: tuple         # prompt length of each request
    chunk: int             # prefill chunk: up to this many tokens of every request per step
    decode_steps: int
    verify: int            # DSpark: tokens verified per request in a decode step (next_n)
    heads: int
    index_heads: int       # V4.1: 32
    index_topk: int        # V4.1: 512
    o_rank: int
    window: int            # sliding window (V4.1: 128)
    candidate_blocks: int  # blocks L20 publishes per row (V4.1-Flash: 2048)
    candidate_block: int   # positions per candidate block (V4.1-Flash: 8)

    @property
    def requests(self) -> int:
        return len(self.prompts)


PRODUCTION = Sizes(prompts=(4096, 3071), chunk=2048, decode_steps=4, verify=5, heads=64, index_heads=32,
                   index_topk=512, o_rank=1024, window=128, candidate_blocks=256, candidate_block=8)
TINY = Sizes(prompts=(70, 37), chunk=40, decode_steps=2, verify=5, heads=8, index_heads=4, index_topk=8,
             o_rank=64, window=16, candidate_blocks=4, candidate_block=4)


@dataclass(frozen=True)
class LayerSpec:
    name: str
    ratio: int
    owner: str             # whose compressed cache (and index keys) the layer reads
    indexer: str           # "dense", "reuse" (the owner's top-k), "consumer" (of the candidate source)


LAYERS = (LayerSpec("L2", 2, "L2", "dense"), LayerSpec("L3", 2, "L2", "reuse"),
          LayerSpec("L20", 1, "L20", "dense"), LayerSpec("L24", 1, "L20", "consumer"))
CANDIDATE_SOURCE = "L20"


@dataclass
class Stack:
    """Weights, tables and initial (poisoned) caches of the four layers; per layer name."""

    sizes: Sizes
    rope: torch.Tensor                 # fp32 [max_pos, 64]: the SWA / query table (theta 10000)
    compress_rope: torch.Tensor        # fp32 [max_pos, 64]: the compressed entries' table (theta 160000)
    weights: dict                      # name -> SimpleNamespace of that layer's weights
    tables: dict                       # "swa:<name>", "comp:<owner>", "keys:<owner>", "state:<owner>"
    caches: dict                       # same keys; each run works on copies
    steps: list = field(default_factory=list)
    meta: list = field(default_factory=list)
    reference: tuple | None = None


def make_stack(sizes: Sizes, device="cpu", seed=0) -> Stack:
    """Random weights, block tables (disjoint random pages per request) and caches whose unwritten
    bytes are poison (random bytes; NaN in the compressor state)."""
    g = torch.Generator().manual_seed(seed)
    R, H = sizes.requests, sizes.heads
    max_len = max(sizes.prompts) + sizes.decode_steps * sizes.verify
    pages = math.ceil(max_len / BLOCK)
    table = lambda: torch.randperm(R * pages, generator=g).view(R, pages).to(torch.int32)
    poison = lambda layout: torch.randint(0, 256, formats.kv_cache_spec(R * pages, BLOCK, layout)[0], generator=g,
                                          dtype=torch.uint8)
    tables, caches, weights = {}, {}, {}
    for spec in LAYERS:
        tables[f"swa:{spec.name}"], caches[f"swa:{spec.name}"] = table(), poison(MAIN)
        w = SimpleNamespace(sink=torch.randn(H, generator=g))
        groups = H // HEADS_PER_GROUP
        w.wo_a, w.wo_a_scale = quantize_blocks(torch.randn(groups, sizes.o_rank, HEADS_PER_GROUP * 512, generator=g)
                                               * 0.02, 32, width=32)
        if spec.owner == spec.name:
            tables[f"comp:{spec.name}"], caches[f"comp:{spec.name}"] = table(), poison(EXTRA)
            tables[f"keys:{spec.name}"] = table()
            caches[f"keys:{spec.name}"] = torch.randint(0, 256, (R * pages, BLOCK, 1, formats.INDEX_MXFP4_TOKEN_BYTES),
                                                        generator=g, dtype=torch.uint8)
            if spec.ratio == 2:
                tables[f"state:{spec.name}"] = table()
                caches[f"state:{spec.name}"] = torch.full((R * pages, BLOCK, 2 * 512), float("nan"))
            w.norm = 0.3 * (1 + 0.1 * torch.randn(512, generator=g))
            w.wk = torch.randn(512, formats.INDEX_DIM, generator=g) * 512 ** -0.5
            w.k_norm = 1 + 0.1 * torch.randn(formats.INDEX_DIM, generator=g)
        weights[spec.name] = SimpleNamespace(**{k: v.to(device) for k, v in vars(w).items()})
    move = lambda d: {k: v.to(device) for k, v in d.items()}
    stack = Stack(sizes, cos_sin_cache(max_len + 1).to(device),
                  cos_sin_cache(max_len + 1, theta=160000.0).to(device), weights, move(tables), move(caches))
    stack.steps = schedule(sizes, device, verify=sizes.verify)
    stack.meta = [step_meta(stack, step) for step in stack.steps]
    return stack


def step_meta(stack: Stack, step: Step) -> dict:
    """What an engine's scheduler prepares for one step, per layer name (positions only)."""
    sizes, t = stack.sizes, stack.tables
    p, req = step.positions, step.token_to_req
    rows = req.long()
    decode = step.kind == "decode"
    meta = {}
    for spec in LAYERS:
        m = SimpleNamespace()
        m.swa_slot, m.swa_idx, m.swa_lens = window_indices(p, t[f"swa:{spec.name}"][rows], sizes.window, BLOCK)
        r, owner = spec.ratio, spec.owner
        closes = (p + 1) % r == 0
        entry = ((p + 1) // r - 1).clamp_min(0)
        m.comp_slot = torch.where(closes, entry_slots(t[f"comp:{owner}"], req, entry, BLOCK), -1)
        m.key_slot = torch.where(closes, entry_slots(t[f"keys:{owner}"], req, entry, BLOCK), -1)
        m.key_pos = (p // r) * r                                    # the group's first position
        if r == 2:
            m.state_slot = entry_slots(t[f"state:{owner}"], req, p, BLOCK)
        visible = ((p + 1) // r).to(torch.int32)                   # compressed entries a token sees
        if decode:                                                  # rows of `verify` tokens per request
            m.batch, m.next_n = sizes.requests, sizes.verify
            m.context_lens = visible.view(sizes.requests, sizes.verify)
            m.block_table = t[f"keys:{owner}"]
        else:                                                       # a row per prefill token
            m.batch, m.next_n = p.shape[0], 1
            m.context_lens = visible[:, None]
            m.block_table = t[f"keys:{owner}"][rows]
        m.row_lens = visible
        m.max_context_len = t[f"keys:{owner}"].shape[1] * BLOCK
        meta[spec.name] = m
    return meta


def activations(stack: Stack, step: Step, spec: LayerSpec) -> SimpleNamespace:
    """The layer's projection outputs for the step, from a generator seeded by (layer, step)."""
    device = step.positions.device
    g = torch.Generator(device=device).manual_seed(LAYERS.index(spec) * 100003 + step.number)
    randn = lambda *shape: torch.randn(*shape, generator=g, device=device)
    T, H, IH = step.positions.shape[0], stack.sizes.heads, stack.sizes.index_heads
    x = SimpleNamespace(q=(randn(T, H, 512) * 2).to(torch.bfloat16), kv=(randn(T, 512) * 0.3).to(torch.bfloat16))
    if spec.owner == spec.name:
        x.comp_kv = randn(T, 512)
        x.comp_score = randn(T, 512) * 2 if spec.ratio == 2 else None
    if spec.indexer != "reuse":
        x.index_q = to_fp8(randn(T, IH, formats.INDEX_DIM) * 2)
        x.index_weights = randn(T, IH) * (IH * formats.INDEX_DIM) ** -0.5   # V4.1's head-weight scaling folded in
    return x


def run_step(stack: Stack, step: Step, xs: dict, caches: dict, op: Runner) -> dict:
    """One forward step of the stack on ``caches`` (written in place). Returns per layer name its
    attention output bf16 [T, H, 512], z bf16 [T, G, o_rank] and top-k (row-local positions)."""
    p, req, sizes = step.positions, step.token_to_req, stack.sizes
    meta, outputs, published = stack.meta[step.number], {}, {}
    for spec in LAYERS:
        m, x, w, name, owner = meta[spec.name], xs[spec.name], stack.weights[spec.name], spec.name, spec.owner
        q = op(f"{name} insert", "qnorm_rope_kv_insert", q=x.q, kv=x.kv, positions=p, cos_sin_cache=stack.rope,
               kv_cache=caches[f"swa:{name}"], slot_mapping=m.swa_slot, layout=MAIN, block_size=BLOCK, eps=EPS)
        if owner == name:
            state = dict(state_cache=None, state_slot_mapping=None, state_block_table=None, token_to_req=None)
            if spec.ratio == 2:
                state = dict(state_cache=caches[f"state:{name}"], state_slot_mapping=m.state_slot,
                             state_block_table=stack.tables[f"state:{name}"], token_to_req=req)
            latent = torch.zeros(p.shape[0], 512, dtype=torch.bfloat16, device=p.device)
            op(f"{name} compress", "compress_kv_insert", kv=x.comp_kv, score=x.comp_score, positions=p, ape=None,
               norm_weight=w.norm, cos_sin_cache=stack.compress_rope, **state, kv_cache=caches[f"comp:{name}"],
               slot_mapping=m.comp_slot, layout=EXTRA, ratio=spec.ratio, block_size=BLOCK, eps=EPS, latent=latent)
            keys = latent.float() @ w.wk                           # engine side: the indexer's wk
            op(f"{name} index keys", "compress_kv_insert", kv=keys, score=None, positions=m.key_pos, ape=None,
               norm_weight=w.k_norm, cos_sin_cache=stack.compress_rope, state_cache=None, state_slot_mapping=None,
               state_block_table=None, token_to_req=None, kv_cache=caches[f"keys:{name}"], slot_mapping=m.key_slot,
               layout=KEYS, ratio=1, block_size=BLOCK, eps=EPS)
        if spec.indexer == "reuse":
            local = outputs[owner]["topk"]
        else:
            shape = (m.batch, m.next_n, sizes.index_heads, formats.INDEX_DIM)
            paged = dict(q=x.index_q.view(shape), kv_cache=caches[f"keys:{owner}"], weights=x.index_weights,
                         context_lens=m.context_lens, block_table=m.block_table, clean=False)
            if spec.indexer == "dense":
                logits = op(f"{name} indexer logits", "paged_mqa_logits", **paged, max_context_len=m.max_context_len)
                local = op(f"{name} top-k", "indexer_topk", logits=logits, k=sizes.index_topk, seq_lens=m.context_lens)
                if name == CANDIDATE_SOURCE:
                    published["blocks"], _ = op(f"{name} candidate blocks", "candidate_blocks", logits=logits,
                                                sparse_block=sizes.candidate_block,
                                                num_blocks=sizes.candidate_blocks, seq_lens=m.context_lens)
            else:
                blocks = published["blocks"]
                logits = op(f"{name} sparse logits", "paged_sparse_mqa_logits", **paged, blocks=blocks,
                            sparse_block=sizes.candidate_block)
                valid = formats.candidate_lens(blocks, m.row_lens, sizes.candidate_block)
                columns = op(f"{name} top-k", "indexer_topk", logits=logits, k=sizes.index_topk,
                             row_starts=torch.zeros_like(valid), row_ends=valid)
                local = formats.candidate_positions(columns, blocks, sizes.candidate_block)
        extra_idx, extra_lens = formats.to_global_indices(local, stack.tables[f"comp:{owner}"], req, BLOCK)
        attn, _ = op(f"{name} attention", f"sparse_mla_{step.kind}", q=q, kv_cache=caches[f"swa:{name}"],
                     indices=m.swa_idx, topk_lens=m.swa_lens, layout=MAIN, block_size=BLOCK,
                     softmax_scale=SOFTMAX_SCALE, attn_sink=w.sink, extra_kv_cache=caches[f"comp:{owner}"],
                     extra_indices=extra_idx, extra_topk_lens=extra_lens, extra_block_size=BLOCK, extra_layout=EXTRA,
                     need_lse=False)
        a, a_scale = op(f"{name} inverse RoPE + quant", "inv_rope_fp8_quant", o=attn, positions=p,
                        cos_sin_cache=stack.rope, n_groups=w.wo_a.shape[0], block=32)
        z = op(f"{name} o-projection", "fp8_einsum", equation="bhr,hdr->bhd", a=a, a_scale=a_scale, b=w.wo_a,
               b_scale=w.wo_a_scale)
        outputs[name] = dict(attn=attn, z=z, topk=local)
    return outputs


def run_stack(stack: Stack, setting: str, judge: bool = False):
    """All steps under ``setting`` on fresh copies of the caches: (outputs per step, caches, stages)."""
    caches = {name: cache.clone() for name, cache in stack.caches.items()}
    op = Runner(judge)
    with backend_setting(setting):
        outputs = [run_step(stack, step, {s.name: activations(stack, step, s) for s in LAYERS}, caches, op)
                   for step in stack.steps]
    return outputs, caches, op.stages


def _written_rows(stack: Stack, caches: dict) -> dict[str, torch.Tensor]:
    """fp32 contents of every slot the steps wrote, per cache (the rest holds poison)."""
    rows = {}
    for spec in LAYERS:
        slots = lambda attr: torch.cat([getattr(meta[spec.name], attr) for meta in stack.meta])
        rows[f"swa:{spec.name}"] = formats.read_kv(caches[f"swa:{spec.name}"], MAIN, BLOCK, slots("swa_slot"))
        if spec.owner == spec.name:
            comp, keys = slots("comp_slot"), slots("key_slot")
            rows[f"comp:{spec.name}"] = formats.read_kv(caches[f"comp:{spec.name}"], EXTRA, BLOCK, comp[comp >= 0])
            keys = keys[keys >= 0]
            rows[f"keys:{spec.name}"] = formats.unpack_index_keys(caches[f"keys:{spec.name}"])[keys // BLOCK,
                                                                                               keys % BLOCK]
    return rows


def compare(stack: Stack, setting: str) -> dict:
    """The steps under ``setting`` (every call judged by its conformance rule) against the
    all-reference run: per (layer, phase) the largest calc_diff of attention and z and the smallest
    top-k overlap, calc_diff of every written cache row, and ``ok``."""
    if stack.reference is None:
        stack.reference = run_stack(stack, "reference")[:2]
    ref_out, ref_caches = stack.reference
    got_out, got_caches, stages = run_stack(stack, setting, judge=True)
    phases = {}
    for step, got_step, ref_step in zip(stack.steps, got_out, ref_out):
        for name, got in got_step.items():
            ref = ref_step[name]
            ph = phases.setdefault((name, step.kind), dict(attn=0.0, z=0.0, topk=1.0))
            share, same = selection_agreement(got["topk"], ref["topk"])
            ph["topk"] = min(ph["topk"], share)
            ph["attn"] = max(ph["attn"], calc_diff(got["attn"][same], ref["attn"][same]))
            ph["z"] = max(ph["z"], calc_diff(got["z"][same], ref["z"][same]))
    got_rows, ref_rows = _written_rows(stack, got_caches), _written_rows(stack, ref_caches)
    cache_diff = {name: calc_diff(got_rows[name], ref_rows[name]) for name in ref_rows}
    ok = (all(not s["failure"] and s["worst"] <= 1 for s in stages.values())
          and all(ph["attn"] < MAX_ATTN_DIFF and ph["z"] < MAX_Z_DIFF and ph["topk"] >= MIN_TOPK_OVERLAP
                  for ph in phases.values())
          and all(d < MAX_CACHE_DIFF for d in cache_diff.values()))
    return dict(stages=stages, phases=phases, caches=cache_diff, ok=ok)


def format_report(report: dict) -> list[str]:
    lines = [f"  {'stage':32s} {'op':24s} {'backend':12s} calls  worst/bound"]
    for (stage, _), s in report["stages"].items():
        verdict = "ok" if not s["failure"] and s["worst"] <= 1 else f"FAIL: {s['failure']}"
        lines.append(f"  {stage:32s} {s['op']:24s} {','.join(sorted(map(str, s['backends']))):12s} "
                     f"{s['calls']:5d}  {s['worst']:.3f}  {verdict}")
    for (name, kind), ph in report["phases"].items():
        lines.append(f"  {name:3s} vs reference run, {kind:7s}: attn calc_diff {ph['attn']:.2e}  "
                     f"z calc_diff {ph['z']:.2e}  top-k overlap {ph['topk']:.4f}")
    caches = "  ".join(f"{name} {d:.2e}" for name, d in report["caches"].items())
    lines.append(f"  written cache rows calc_diff: {caches}  -> {'ok' if report['ok'] else 'MISMATCH'}")
    return lines


def time_stack(stack: Stack, setting: str) -> list[str]:
    """One line per step (all four layers): median time under ``setting``, eagerly, and for decode
    steps (not the reference's) also as a replayed CUDA graph."""
    caches = {name: cache.clone() for name, cache in stack.caches.items()}
    op, lines = Runner(judge=False), []
    with backend_setting(setting):
        for step in stack.steps:
            xs = {s.name: activations(stack, step, s) for s in LAYERS}
            fn = lambda: run_step(stack, step, xs, caches, op)
            fn()
            eager, replay = time_us(fn, graph=step.kind == "decode" and setting != "reference")
            lines.append(f"  {step.kind:7s} step {step.number:2d} T={step.positions.shape[0]:5d}  "
                         f"{describe_times(eager, replay)}")
    return lines


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                     formatter_class=HelpFormatter)
    parser.add_argument("--device", default=str(default_device()), help="torch device of the tensors")
    parser.add_argument("--size", choices=("production", "tiny"), default=None,
                        help="sizes (default: production on a GPU, tiny on the CPU)")
    parser.add_argument("--settings", nargs="+", default=["auto"],
                        help="backend choices to compare with the reference: 'auto' or DSV4OPS_BACKEND values")
    parser.add_argument("--time", action="store_true", help="time every step per setting (GPU)")
    args = parser.parse_args(argv)
    interpreter_on_cpu(torch.device(args.device), "dsv4ops.examples.layer41")
    sizes = PRODUCTION if (args.size or ("production" if "cuda" in args.device else "tiny")) == "production" else TINY
    stack = make_stack(sizes, args.device)
    print(f"{sizes}; {sum(s.kind == 'prefill' for s in stack.steps)} prefill steps, "
          f"{sizes.decode_steps} decode steps of {sizes.verify} tokens per request", flush=True)
    failed = False
    for setting in args.settings:
        print(f"setting {setting}", flush=True)
        try:
            report = compare(stack, setting)
            lines = format_report(report)
            failed |= not report["ok"]
            if args.time:
                lines += time_stack(stack, setting)
        except Exception as exc:                # report it and go on with the next setting
            lines, failed = [f"  error: {type(exc).__name__}: {exc}"], True
        print("\n".join(lines), flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
