"""torch.ops.dsv4ops.*: schema, fake implementations and mutation annotations (torch.library.opcheck),
and torch.compile(fullgraph=True) of a module calling them, compared with eager."""
import pytest
import torch

import dsv4ops
import dsv4ops.torch_ops  # noqa: F401  (registers torch.ops.dsv4ops)
from dsv4ops.conformance.cases import make_case

OPS = torch.ops.dsv4ops


def build(op, **params):
    return make_case(op, **params).build("cpu", seed=4)


def sample_calls():
    kw = build("qnorm_rope_kv_insert", T=3, H=4, layout="fp8_ds_mla", block_size=16, num_blocks=2)
    yield "qnorm_rope_kv_insert", (kw["q"], kw["kv"], kw["positions"], kw["cos_sin_cache"], kw["kv_cache"],
                                   kw["slot_mapping"], torch.empty_like(kw["q"]), "fp8_ds_mla", 16)
    kw = build("sparse_mla_decode", T=3, H=4, topk=32, layout="fp8_ds_mla", extra_topk=32, extra_block_size=2)
    yield "sparse_mla_decode", (kw["q"], kw["kv_cache"], kw["indices"], kw["topk_lens"], "fp8_ds_mla", 64,
                                kw["softmax_scale"], kw["attn_sink"], kw["extra_kv_cache"], kw["extra_indices"],
                                kw["extra_topk_lens"], 2)
    kw = build("paged_mqa_logits", B=2, next_n=2, context=32, H=4, block_size=16, clean=True)
    yield "paged_mqa_logits", (kw["q"], kw["kv_cache"], kw["weights"], kw["context_lens"], kw["block_table"],
                               kw["max_context_len"], True)
    kw = build("fp8_einsum", B=3, H=2, D=128, R=256)
    yield "fp8_einsum", (kw["equation"], kw["a"], kw["a_scale"], kw["b"], kw["b_scale"])
    kw = build("indexer_topk", R=4, W=64, k=8, mode="ranges")
    yield "indexer_topk", (kw["logits"], 8, kw["row_starts"], kw["row_ends"])


SAMPLES = list(sample_calls())


# test_schema compares inputs before and after with ops PyTorch lacks for float8 on the CPU, so
# it runs for the ops without fp8 inputs (the insert's mutation annotations included).
FP8_INPUTS = {"paged_mqa_logits", "fp8_einsum"}


@pytest.mark.parametrize("name,args", SAMPLES, ids=[n for n, _ in SAMPLES])
def test_opcheck(name, args):
    utils = ("test_faketensor", "test_aot_dispatch_dynamic") + (() if name in FP8_INPUTS else ("test_schema",))
    torch.library.opcheck(getattr(OPS, name), args, test_utils=utils)


class DecodeStep(torch.nn.Module):
    """Insert, then logits + top-k, then decode: the ops chained as an engine would."""

    def forward(self, q, kv, positions, cos_sin, cache, slots, idx, lens, sink, idx_q, idx_cache, weights, ctx,
                table):
        OPS.qnorm_rope_kv_insert(q, kv, positions, cos_sin, cache, slots, q, "fp8_ds_mla", 64)
        logits = OPS.paged_mqa_logits(idx_q, idx_cache, weights, ctx, table, 64, True)
        top = OPS.indexer_topk(logits, 16, None, None, ctx, 1)
        out, lse = OPS.sparse_mla_decode(q, cache, idx, lens, "fp8_ds_mla", 64, 512 ** -0.5, sink)
        return out, lse, top


def test_compile_fullgraph_matches_eager():
    ins = build("qnorm_rope_kv_insert", T=4, H=8, layout="fp8_ds_mla", block_size=64, num_blocks=2, skip_slots=0)
    dec = build("sparse_mla_decode", T=4, H=8, topk=64, layout="fp8_ds_mla")
    lg = build("paged_mqa_logits", B=4, next_n=1, context=64, H=4, block_size=16)
    args = (ins["q"], ins["kv"], ins["positions"], ins["cos_sin_cache"], dec["kv_cache"],
            ins["slot_mapping"], dec["indices"], dec["topk_lens"], dec["attn_sink"], lg["q"], lg["kv_cache"],
            lg["weights"], lg["context_lens"], lg["block_table"])
    eager_args = [a.clone() for a in args]
    compiled_args = [a.clone() for a in args]
    expected = DecodeStep()(*eager_args)
    compiled = torch.compile(DecodeStep(), fullgraph=True, backend="aot_eager")
    got = compiled(*compiled_args)
    for e, g in zip(expected, got):
        assert torch.equal(e.isnan(), g.isnan()) and torch.equal(torch.nan_to_num(e), torch.nan_to_num(g))
    assert torch.equal(eager_args[0], compiled_args[0])          # q rewritten in place in both
    assert torch.equal(eager_args[4], compiled_args[4])          # the cache mutation survived compilation
