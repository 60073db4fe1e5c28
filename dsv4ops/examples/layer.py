"""Whole DeepSeek-V4 attention layers through dsv4ops: a prompt's prefill (in chunks), then decode
steps (one token per request, next_n = 1), for one C4 and one C128 layer with random weights:

    qnorm_rope_kv_insert (SWA cache) -> compress_kv_insert (compressed cache; C4 also the indexer key cache)
    -> C4 only: mqa_logits over the gathered index keys (prefill) / paged_mqa_logits (decode) -> indexer_topk
       -> formats.to_global_indices;  C128: every compressed entry written so far
    -> sparse_mla_prefill / sparse_mla_decode (SWA window + compressed entries, attention sink)
    -> inv_rope_fp8_quant -> fp8_einsum (wo_a, the grouped o-projection)

The projections that produce the per-token inputs (q, kv, the compressors' kv and gate, the indexer
query and head weights) are plain matmuls outside dsv4ops; their outputs are drawn at random per step.
``compare`` runs the steps under a ``DSV4OPS_BACKEND`` setting, judging every op call against the
reference on copies of its inputs with the op's conformance rule (docs/ops.md §7), and compares the
run's outputs and caches with the all-reference pipeline. On a GPU ``--time`` times every step:

    python -m dsv4ops.examples.layer --device cuda --settings auto triton --time
"""
from __future__ import annotations

import argparse
import math
from dataclasses import dataclass, field, replace
from types import SimpleNamespace

import torch

import dsv4ops
from dsv4ops import formats
from dsv4ops.ops import OPS
from dsv4ops.sampling import cos_sin_cache
from dsv4ops.tensors import clone_kwargs
from dsv4ops.tolerance import calc_diff
from dsv4ops.backend_support import interpreter_on_cpu
from dsv4ops.cli import HelpFormatter
from dsv4ops.platform import default_device
from dsv4ops.quant import to_fp8

from .common import (HEADS_PER_GROUP, SWA_BLOCK, WINDOW, backend_setting, describe_times, o_proj_weights, time_us,
                     window_indices)

INDEX_BLOCK, STATE_BLOCK = 64, 32          # indexer key page, compressor state page
SOFTMAX_SCALE = 512 ** -0.5
# End-to-end bounds against the all-reference pipeline (per step). Every call agrees with the
# reference within its conformance rule (attention: calc_diff <= 5e-6; the Triton kernels' bf16
# softmax weights give about 3e-6), but allowed differences carry forward: a compressed entry one
# e4m3 step off moves indexer scores, a near-tie in the top-k then selects another entry (bounded by
# MIN_TOPK_OVERLAP; attention and z are compared on the tokens whose selection equals the
# reference's: on the H100 the few others moved C4 decode's calc_diff to 4e-4), and requantizing the
# attention output in FP8 rounds a few values one step differently before the o-projection (z: about
# 5e-5 on the CPU with Triton's interpreter).
MAX_ATTN_DIFF, MAX_Z_DIFF, MAX_CACHE_DIFF, MIN_TOPK_OVERLAP = 1e-4, 1e-3, 1e-4, 0.95


@dataclass(frozen=True)
class Sizes:
    prompts: tuple         # prompt length of each request
    chunk: int             # prefill chunk: up to this many tokens of every request per step
    decode_steps: int
    heads: int             # attention heads H (8 per o-projection group)
    index_heads: int
    index_topk: int
    o_rank: int
    window: int = WINDOW   # sliding window (V4: 128)
    c128_align: int = 128  # C128 index lists are padded with -1 to a multiple of this (vLLM: 128)

    @property
    def requests(self) -> int:
        return len(self.prompts)


PRODUCTION = Sizes(prompts=(4096, 3583, 3070, 2557), chunk=2048, decode_steps=8, heads=64, index_heads=64,
                   index_topk=512, o_rank=1024)     # V4-Flash at TP 1
TINY = Sizes(prompts=(130, 37), chunk=100, decode_steps=2, heads=8, index_heads=8, index_topk=8, o_rank=128,
             window=32, c128_align=16)     # C4 entries completed in prefill and decode; a C128 entry from p = 127 on


@dataclass
class Step:
    """The tokens of one forward step: ``kind`` "prefill" or "decode", positions int64 [T], request
    of each token int32 [T] (tokens grouped by request, in position order; a decode step has the
    same number of tokens per request)."""

    number: int
    kind: str
    positions: torch.Tensor
    token_to_req: torch.Tensor


def schedule(sizes, device, verify: int = 1) -> list[Step]:
    """Chunked prefill of every prompt (``sizes.prompts`` in chunks of ``sizes.chunk``), then
    ``sizes.decode_steps`` steps of ``verify`` tokens per request (1 + MTP draft tokens)."""
    lens = sizes.prompts
    prefill = [[(r, c, min(c + sizes.chunk, n)) for r, n in enumerate(lens) if c < n]
               for c in range(0, max(lens), sizes.chunk)]
    decode = [[(r, n + j * verify, n + (j + 1) * verify) for r, n in enumerate(lens)]
              for j in range(sizes.decode_steps)]
    steps = []
    for number, span in enumerate(prefill + decode):
        pos = torch.cat([torch.arange(a, b) for _, a, b in span])
        req = torch.cat([torch.full((b - a,), r, dtype=torch.int32) for r, a, b in span])
        steps.append(Step(number, "prefill" if number < len(prefill) else "decode", pos.to(device), req.to(device)))
    return steps


@dataclass
class Layer:
    """Weights, block tables and initial (poisoned) caches of one compressed layer."""

    name: str
    ratio: int                      # 4 (C4, with the indexer) or 128 (C128)
    sizes: Sizes
    seed: int
    cos_sin: torch.Tensor           # fp32 [max_pos, 64]
    attn_sink: torch.Tensor         # fp32 [H]
    wo_a: torch.Tensor              # fp8 [G, o_rank, 4096]
    wo_a_scale: torch.Tensor        # fp32 [G, o_rank / 128, 32]
    compressor: dict                # ape fp32 [ratio, c * 512], norm_weight fp32 [512]
    indexer: dict | None            # C4: the indexer compressor's ape [4, 256] and norm_weight [128]
    tables: dict                    # int32 [requests, pages] per cache
    caches: dict                    # initial contents of every cache; each run works on copies
    steps: list = field(default_factory=list)    # the schedule
    meta: list = field(default_factory=list)     # per step: slots, index lists, ranges (engine metadata)
    reference: tuple | None = None               # the all-reference run (outputs, caches), once computed

    @property
    def comp_block(self) -> int:
        return 256 // self.ratio        # compressed entries per page: 64 (C4) or 2 (C128)


def make_layer(ratio: int, sizes: Sizes, device="cpu", seed=0) -> Layer:
    """Random weights, block tables (disjoint random pages per request), caches whose bytes no
    step writes are poison (random bytes; NaN in the compressor state), and the schedule."""
    g = torch.Generator().manual_seed(seed)
    max_len = max(sizes.prompts) + sizes.decode_steps
    R, H, c = sizes.requests, sizes.heads, formats.window_overlap(ratio)

    def table(pages):
        return torch.randperm(R * pages, generator=g).view(R, pages).to(torch.int32)

    def ds_mla(pages, block):
        shape = formats.kv_cache_spec(R * pages, block, "fp8_ds_mla")[0]
        return torch.randint(0, 256, shape, generator=g, dtype=torch.uint8)

    def state(width):
        return torch.full((R * state_pages, STATE_BLOCK, 2 * width), float("nan"))

    swa_pages, state_pages = math.ceil(max_len / SWA_BLOCK), math.ceil(max_len / STATE_BLOCK)
    comp_block = 256 // ratio
    comp_pages = max(1, math.ceil(max_len // ratio / comp_block))
    tables = dict(swa=table(swa_pages), comp=table(comp_pages), state=table(state_pages))
    caches = dict(swa=ds_mla(swa_pages, SWA_BLOCK), comp=ds_mla(comp_pages, comp_block), state=state(c * 512))
    compressor = dict(ape=torch.randn(ratio, c * 512, generator=g) * 0.5,
                      norm_weight=0.3 * (1 + 0.1 * torch.randn(512, generator=g)))   # entries of |V| ~ the SWA rows'
    indexer = None
    if ratio == 4:
        tables.update(index=table(comp_pages), index_state=table(state_pages))
        caches.update(index=torch.randint(0, 256, (R * comp_pages, INDEX_BLOCK, 1, formats.INDEX_TOKEN_BYTES),
                                          generator=g, dtype=torch.uint8), index_state=state(2 * formats.INDEX_DIM))
        indexer = dict(ape=torch.randn(4, 2 * formats.INDEX_DIM, generator=g) * 0.5,
                       norm_weight=1 + 0.1 * torch.randn(formats.INDEX_DIM, generator=g))
    wo_a, wo_a_scale = o_proj_weights(H // HEADS_PER_GROUP, sizes.o_rank, g)
    move = lambda d: {k: v.to(device) for k, v in d.items()}
    layer = Layer(f"C{ratio}", ratio, sizes, seed, cos_sin_cache(max_len + 1).to(device),
                  torch.randn(H, generator=g).to(device), wo_a.to(device), wo_a_scale.to(device), move(compressor),
                  indexer and move(indexer), move(tables), move(caches))
    layer.steps = schedule(sizes, device)
    layer.meta = [step_meta(layer, step) for step in layer.steps]
    return layer


def entry_slots(table: torch.Tensor, req: torch.Tensor, index: torch.Tensor, block: int) -> torch.Tensor:
    """int64 cache slot of request-local entry ``index`` through ``table`` (``index`` >= 0)."""
    return table.long()[req.long(), index // block] * block + index % block


def step_meta(layer: Layer, step: Step) -> SimpleNamespace:
    """What an engine's scheduler prepares for one step of this layer (positions only, no outputs)."""
    p, req, t, ratio = step.positions, step.token_to_req, layer.tables, layer.ratio
    m = SimpleNamespace()
    m.swa_slot, m.swa_idx, m.swa_lens = window_indices(p, t["swa"][req.long()], layer.sizes.window)
    m.state_slot = entry_slots(t["state"], req, p, STATE_BLOCK)
    closes = (p + 1) % ratio == 0                              # the token completes a compressed entry
    entry = ((p + 1) // ratio - 1).clamp_min(0)
    m.comp_slot = torch.where(closes, entry_slots(t["comp"], req, entry, layer.comp_block), -1)
    n = ((p + 1) // ratio).to(torch.int32)                     # compressed entries the token sees
    if ratio == 4:
        m.index_state_slot = entry_slots(t["index_state"], req, p, STATE_BLOCK)
        m.index_slot = torch.where(closes, entry_slots(t["index"], req, entry, INDEX_BLOCK), -1)
        if step.kind == "decode":
            m.context_lens = n[:, None]                        # 2-D: one count per row, as V4 passes them
            m.max_context_len = t["index"].shape[1] * INDEX_BLOCK
        else:                                                  # the key buffer: each request's entries in turn
            counts = torch.zeros(layer.sizes.requests, dtype=torch.long, device=p.device)
            counts.scatter_reduce_(0, req.long(), n.long(), "amax")
            starts = counts.cumsum(0) - counts
            key_req = torch.repeat_interleave(torch.arange(len(counts), device=p.device), counts)
            key_entry = torch.arange(len(key_req), device=p.device) - starts[key_req]
            m.key_page = t["index"].long()[key_req, key_entry // INDEX_BLOCK]
            m.key_offset = key_entry % INDEX_BLOCK
            m.ks = starts[req.long()].to(torch.int32)
            m.ke = m.ks + n
    else:                                                      # C128: every entry so far, list width aligned
        align = layer.sizes.c128_align
        width = align * max(1, math.ceil(int(n.max()) / align))
        j = torch.arange(width, device=p.device, dtype=torch.int32)
        local = torch.where(j[None, :] < n[:, None], j[None, :], -1)
        m.extra_idx, m.extra_lens = formats.to_global_indices(local, t["comp"], req, layer.comp_block)
    return m


def activations(layer: Layer, step: Step) -> SimpleNamespace:
    """The step's projection outputs, drawn from a generator seeded by (layer, step): every run of
    the step sees the same values."""
    device = step.positions.device
    g = torch.Generator(device=device).manual_seed(layer.seed * 100003 + step.number)
    randn = lambda *shape: torch.randn(*shape, generator=g, device=device)
    T, H, width = step.positions.shape[0], layer.sizes.heads, formats.window_overlap(layer.ratio) * 512
    x = SimpleNamespace(q=(randn(T, H, 512) * 2).to(torch.bfloat16), kv=(randn(T, 512) * 0.3).to(torch.bfloat16),
                        comp_kv=randn(T, width), comp_score=randn(T, width) * 2)
    if layer.indexer is not None:
        IH = layer.sizes.index_heads
        x.index_kv, x.index_score = randn(T, 2 * formats.INDEX_DIM), randn(T, 2 * formats.INDEX_DIM) * 2
        x.index_q, x.index_weights = to_fp8(randn(T, IH, formats.INDEX_DIM) * 2), randn(T, IH) * IH ** -0.5
    return x


class Runner:
    """Calls ops by name (keyword arguments) under the current setting. With ``judge``, every call
    also runs on the reference on copies of its inputs and the op's conformance rule judges it;
    ``stages`` collects per (stage, op) the backends that ran, the calls, the worst error in units of the
    rule's bound, and the first failure."""

    def __init__(self, judge: bool):
        self.judge = judge
        self.stages: dict[tuple[str, str], dict] = {}

    def __call__(self, stage: str, op: str, **kwargs):
        if not self.judge:
            return dsv4ops.dispatch(op, **kwargs)
        backend = dsv4ops.explain(op, **kwargs).backend
        s = self.stages.setdefault((stage, op), dict(op=op, backends=set(), calls=0, worst=0.0, failure=""))
        s["backends"].add(backend)
        s["calls"] += 1
        if backend == "reference":                  # nothing to judge
            return dsv4ops.dispatch(op, **kwargs)
        ref_kwargs = clone_kwargs(kwargs)
        got = dsv4ops.dispatch(op, **kwargs)
        reference = OPS[op].function(**ref_kwargs, backend="reference")
        verdict = OPS[op].spec.conformance.compare({}, ref_kwargs, reference, kwargs, got)
        s["worst"] = max(s["worst"], verdict.worst) if not math.isnan(verdict.worst) else math.nan
        if not verdict.ok and not s["failure"]:
            s["failure"] = verdict.message
        return got


def run_step(layer: Layer, step: Step, x: SimpleNamespace, caches: dict, op: Runner) -> dict:
    """One forward step of the layer on ``caches`` (written in place). Returns the attention output
    bf16 [T, H, 512], the o-projection z bf16 [T, G, o_rank] and the C4 top-k (row-local) or None."""
    m, t, ratio = layer.meta[step.number], layer.tables, layer.ratio
    p, req = step.positions, step.token_to_req
    q = op("insert", "qnorm_rope_kv_insert", q=x.q, kv=x.kv, positions=p, cos_sin_cache=layer.cos_sin,
           kv_cache=caches["swa"], slot_mapping=m.swa_slot, layout="fp8_ds_mla", block_size=SWA_BLOCK)
    compress = dict(positions=p, cos_sin_cache=layer.cos_sin, token_to_req=req, ratio=ratio)
    op("compress", "compress_kv_insert", kv=x.comp_kv, score=x.comp_score, **layer.compressor, **compress,
       state_cache=caches["state"], state_slot_mapping=m.state_slot, state_block_table=t["state"],
       kv_cache=caches["comp"], slot_mapping=m.comp_slot, layout="fp8_ds_mla", block_size=layer.comp_block)
    local = None
    if ratio == 4:
        op("compress index keys", "compress_kv_insert", kv=x.index_kv, score=x.index_score, **layer.indexer,
           **compress, state_cache=caches["index_state"], state_slot_mapping=m.index_state_slot,
           state_block_table=t["index_state"], kv_cache=caches["index"], slot_mapping=m.index_slot,
           layout="index_fp8", block_size=INDEX_BLOCK)
        k = layer.sizes.index_topk
        if step.kind == "prefill":          # engine side: gather the requests' index keys into one buffer
            values, scales = formats.index_key_views(caches["index"])
            keys = values.view(torch.uint8)[m.key_page, m.key_offset].view(values.dtype)
            logits = op("indexer logits", "mqa_logits", q=x.index_q, k=keys, k_scale=scales[m.key_page, m.key_offset],
                        weights=x.index_weights, ks=m.ks, ke=m.ke, clean=False)
            local = op("top-k", "indexer_topk", logits=logits, k=k, row_starts=m.ks, row_ends=m.ke)
        else:
            logits = op("indexer logits", "paged_mqa_logits", q=x.index_q[:, None], kv_cache=caches["index"],
                        weights=x.index_weights, context_lens=m.context_lens, block_table=t["index"],
                        max_context_len=m.max_context_len, clean=False)
            local = op("top-k", "indexer_topk", logits=logits, k=k, seq_lens=m.context_lens)
        extra_idx, extra_lens = formats.to_global_indices(local, t["comp"], req, layer.comp_block)
    else:
        extra_idx, extra_lens = m.extra_idx, m.extra_lens
    attn, _ = op("attention", f"sparse_mla_{step.kind}", q=q, kv_cache=caches["swa"], indices=m.swa_idx,
                 topk_lens=m.swa_lens, layout="fp8_ds_mla", block_size=SWA_BLOCK, softmax_scale=SOFTMAX_SCALE,
                 attn_sink=layer.attn_sink, extra_kv_cache=caches["comp"], extra_indices=extra_idx,
                 extra_topk_lens=extra_lens, extra_block_size=layer.comp_block, need_lse=False)
    a, a_scale = op("inverse RoPE + quant", "inv_rope_fp8_quant", o=attn, positions=p, cos_sin_cache=layer.cos_sin,
                    n_groups=layer.wo_a.shape[0])
    z = op("o-projection", "fp8_einsum", equation="bhr,hdr->bhd", a=a, a_scale=a_scale, b=layer.wo_a,
           b_scale=layer.wo_a_scale)
    return dict(attn=attn, z=z, topk=local)


def run_layer(layer: Layer, setting: str, judge: bool = False):
    """All steps under ``setting`` on fresh copies of the layer's caches: (outputs per step, caches, stages)."""
    caches = {name: cache.clone() for name, cache in layer.caches.items()}
    op = Runner(judge)
    with backend_setting(setting):
        outputs = [run_step(layer, step, activations(layer, step), caches, op) for step in layer.steps]
    return outputs, caches, op.stages


def _selection_agreement(got: torch.Tensor, ref: torch.Tensor) -> tuple[float, torch.Tensor]:
    """The smallest per-row share of the reference's selected set that ``got`` selected too (rows
    the reference leaves empty count 1 when ``got`` is empty too), and which rows selected exactly
    the same set (bool [rows])."""
    if ref.numel() == 0:
        return 1.0, torch.ones(ref.shape[0], dtype=torch.bool, device=ref.device)
    width = int(max(got.max(), ref.max())) + 2           # column width - 1 collects the -1 entries

    def chosen(idx):
        marks = torch.zeros(idx.shape[0], width, dtype=torch.bool, device=idx.device)
        return marks.scatter_(1, torch.where(idx >= 0, idx, width - 1).long(), True)[:, :-1]

    g, r = chosen(got), chosen(ref)
    n = r.sum(1)
    share = torch.where(n > 0, (g & r).sum(1) / n.clamp_min(1), (~g.any(1)).float())
    return float(share.min()), (g == r).all(1)


def _written_rows(layer: Layer, caches: dict) -> dict[str, torch.Tensor]:
    """fp32 contents of every slot the steps wrote, per cache (the rest holds poison)."""
    slots = lambda name: torch.cat([getattr(m, name) for m in layer.meta])
    rows = dict(swa=formats.read_kv(caches["swa"], "fp8_ds_mla", SWA_BLOCK, slots("swa_slot")))
    comp = slots("comp_slot")
    rows["comp"] = formats.read_kv(caches["comp"], "fp8_ds_mla", layer.comp_block, comp[comp >= 0])
    if layer.ratio == 4:
        index = slots("index_slot")
        index = index[index >= 0]
        keys = formats.unpack_index_keys(caches["index"])
        rows["index"] = keys[index // INDEX_BLOCK, index % INDEX_BLOCK]
    return rows


def compare(layer: Layer, setting: str) -> dict:
    """The steps under ``setting`` (every op call judged by its conformance rule) against the
    all-reference pipeline: ``stages`` as Runner collects them; per phase the largest calc_diff
    of the attention output and of z over its steps and the smallest top-k overlap; calc_diff of
    every written cache row; ``ok``."""
    if layer.reference is None:
        layer.reference = run_layer(layer, "reference")[:2]
    ref_out, ref_caches = layer.reference
    got_out, got_caches, stages = run_layer(layer, setting, judge=True)
    phases = {}
    for step, got, ref in zip(layer.steps, got_out, ref_out):
        ph = phases.setdefault(step.kind, dict(attn=0.0, z=0.0, topk=1.0))
        same = slice(None)            # tokens whose attention read the same entries as the reference's
        if ref["topk"] is not None:
            share, same = _selection_agreement(got["topk"], ref["topk"])
            ph["topk"] = min(ph["topk"], share)
        ph["attn"] = max(ph["attn"], calc_diff(got["attn"][same], ref["attn"][same]))
        ph["z"] = max(ph["z"], calc_diff(got["z"][same], ref["z"][same]))
    got_rows, ref_rows = _written_rows(layer, got_caches), _written_rows(layer, ref_caches)
    cache_diff = {name: calc_diff(got_rows[name], ref_rows[name]) for name in ref_rows}
    ok = (all(not s["failure"] and s["worst"] <= 1 for s in stages.values())
          and all(ph["attn"] < MAX_ATTN_DIFF and ph["z"] < MAX_Z_DIFF and ph["topk"] >= MIN_TOPK_OVERLAP
                  for ph in phases.values())
          and all(d < MAX_CACHE_DIFF for d in cache_diff.values()))
    return dict(stages=stages, phases=phases, caches=cache_diff, ok=ok)


def time_layer(layer: Layer, setting: str) -> list[str]:
    """One line per step: its median time under ``setting``, eagerly, and for decode steps (not
    the reference's) also as a replayed CUDA graph; then the totals. Each step runs once before it
    is timed (the steps build on each other's caches); running it again rewrites the same bytes."""
    caches = {name: cache.clone() for name, cache in layer.caches.items()}
    op, lines, totals = Runner(judge=False), [], {}
    with backend_setting(setting):
        for step in layer.steps:
            x = activations(layer, step)
            fn = lambda: run_step(layer, step, x, caches, op)
            fn()
            note = ""
            try:
                eager, replay = time_us(fn, graph=step.kind == "decode" and setting != "reference")
            except Exception as exc:            # e.g. an op that synchronises cannot be captured
                (eager, replay), note = time_us(fn, graph=False), f"  (graph capture failed: {exc!r})"
            T = step.positions.shape[0]
            lines.append(f"  {layer.name} {step.kind:7s} step {step.number:2d} T={T:5d}  "
                         f"{describe_times(eager, replay)}{note}")
            total = totals.setdefault(step.kind, [0, 0, 0.0, 0.0])
            total[0] += 1
            total[1] += T
            total[2] += eager
            total[3] += replay if replay is not None else math.nan
    for kind, (n, tokens, eager, replay) in totals.items():
        graph = "" if math.isnan(replay) else f", graph replay {replay / n:.1f} us"
        lines.append(f"  {layer.name} {kind} total: {n} steps, {tokens} tokens, eager {eager:.1f} us "
                     f"({eager / n:.1f} us per step{graph})")
    return lines


def format_report(layer: Layer, report: dict) -> list[str]:
    """Report lines: one per (stage, op) with the rule's verdict, the comparison per phase, the caches."""
    lines = [f"  {layer.name} {'stage':22s} {'op':22s} {'backend':12s} calls  worst/bound"]
    for (stage, _), s in report["stages"].items():
        verdict = "ok" if not s["failure"] and s["worst"] <= 1 else f"FAIL: {s['failure']}"
        lines.append(f"  {layer.name} {stage:22s} {s['op']:22s} {','.join(sorted(map(str, s['backends']))):12s} "
                     f"{s['calls']:5d}  {s['worst']:.3f}  {verdict}")
    for kind, ph in report["phases"].items():
        topk = f"  top-k overlap {ph['topk']:.4f}" if layer.ratio == 4 else ""
        lines.append(f"  {layer.name} vs reference pipeline, {kind:7s}: attn calc_diff {ph['attn']:.2e}  "
                     f"z calc_diff {ph['z']:.2e}{topk}")
    caches = "  ".join(f"{name} {d:.2e}" for name, d in report["caches"].items())
    lines.append(f"  {layer.name} written cache rows calc_diff: {caches}  -> {'ok' if report['ok'] else 'MISMATCH'}")
    return lines


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                     formatter_class=HelpFormatter)
    parser.add_argument("--device", default=str(default_device()), help="torch device of the layers' tensors")
    parser.add_argument("--size", choices=("production", "tiny"), default=None,
                        help="base sizes (default: production on a GPU, tiny on the CPU); the flags below override")
    parser.add_argument("--prompts", type=int, nargs="+", default=None, help="prompt length of each request")
    for name, help_ in [("chunk", "prefill chunk, tokens per request"), ("decode-steps", "decode steps after prefill"),
                        ("heads", "attention heads H (a multiple of 8)"), ("index-heads", "indexer heads"),
                        ("index-topk", "compressed entries the C4 indexer selects"), ("o-rank", "wo_a output rank"),
                        ("window", "sliding window (tokens)")]:
        parser.add_argument(f"--{name}", type=int, default=None, help=help_)
    parser.add_argument("--layers", nargs="+", type=int, default=[4, 128], choices=(4, 128), help="compress ratios")
    parser.add_argument("--settings", nargs="+", default=["auto"],
                        help="backend choices to compare with the reference: 'auto' or DSV4OPS_BACKEND values")
    parser.add_argument("--time", action="store_true", help="time every step per setting (GPU)")
    args = parser.parse_args(argv)
    interpreter_on_cpu(torch.device(args.device), "dsv4ops.examples.layer")
    base = PRODUCTION if (args.size or ("production" if "cuda" in args.device else "tiny")) == "production" else TINY
    sizes = replace(base, **{k: tuple(v) if k == "prompts" else v for k, v in vars(args).items()
                             if k in Sizes.__dataclass_fields__ and v is not None})
    layers = [make_layer(ratio, sizes, args.device, seed=i) for i, ratio in enumerate(args.layers)]
    print(f"{sizes}; {sum(s.kind == 'prefill' for s in layers[0].steps)} prefill steps, "
          f"{sizes.decode_steps} decode steps", flush=True)
    failed = False
    for setting in args.settings:
        print(f"setting {setting}", flush=True)
        for layer in layers:
            try:
                report = compare(layer, setting)
                lines = format_report(layer, report)
                failed |= not report["ok"]
                if args.time:
                    lines += time_layer(layer, setting)
            except Exception as exc:            # report it and go on with the next layer / setting
                lines, failed = [f"  {layer.name} error: {type(exc).__name__}: {exc}"], True
            print("\n".join(lines), flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
