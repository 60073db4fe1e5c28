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


def split(name, kw):
    """Public-function keywords -> (positional, keyword) arguments of the torch op, from the op's spec."""
    spec = dsv4ops.ops.OPS[name].spec
    args = tuple(kw[a.name] for a in spec.args if not a.keyword_only)
    kwargs = {a.name: kw[a.name] for a in spec.args if a.keyword_only and a.name in kw and kw[a.name] is not None}
    return args, kwargs


def sample_calls():
    kw = build("qnorm_rope_kv_insert", T=3, H=4, layout="fp8_ds_mla", block_size=16, num_blocks=2)
    yield "qnorm_rope_kv_insert", split("qnorm_rope_kv_insert", {**kw, "out": torch.empty_like(kw["q"])})
    kw = build("sparse_mla_decode", T=3, H=4, topk=32, layout="fp8_ds_mla", extra_topk=32, extra_block_size=2)
    yield "sparse_mla_decode", split("sparse_mla_decode", {**kw, "out": None})
    out = torch.empty(3, 4, 512, dtype=torch.bfloat16)
    yield "sparse_mla_decode_out", split("sparse_mla_decode", {**kw, "out": out})
    kw = build("paged_mqa_logits", B=2, next_n=2, context=32, H=4, block_size=16, clean=True)
    yield "paged_mqa_logits", split("paged_mqa_logits", {**kw, "out": None})
    kw = build("fp8_einsum", B=3, H=2, D=128, R=256)
    yield "fp8_einsum", split("fp8_einsum", {**kw, "out": None})
    kw = build("indexer_topk", R=4, W=64, k=8, mode="ranges")
    yield "indexer_topk", split("indexer_topk", {**kw, "out": None})
    yield "indexer_topk_out", split("indexer_topk", {**kw, "out": torch.empty(4, 8, dtype=torch.int32)})
    kw = build("mqa_logits", T=5, S=40, H=4, ranges="random", clean=True)
    yield "mqa_logits", split("mqa_logits", {**kw, "out": None})


SAMPLES = list(sample_calls())


# test_schema compares inputs before and after with ops PyTorch lacks for float8 on the CPU, so
# it runs for the ops without fp8 inputs (the insert's mutation annotations included).
FP8_INPUTS = {"paged_mqa_logits", "fp8_einsum", "mqa_logits"}


@pytest.mark.parametrize("name,call", SAMPLES, ids=[n for n, _ in SAMPLES])
def test_opcheck(name, call):
    utils = ("test_faketensor", "test_aot_dispatch_dynamic") + (() if name in FP8_INPUTS else ("test_schema",))
    torch.library.opcheck(getattr(OPS, name), *call, test_utils=utils)


@pytest.mark.parametrize("name", dsv4ops.OP_NAMES)
def test_torch_op_takes_every_argument_of_the_public_function(name):
    """Parity: the functional torch op and its out form together take exactly the public arguments."""
    import inspect
    op = dsv4ops.ops.OPS[name]
    public = [p for p in inspect.signature(op.function).parameters if p != "backend"]
    forms = [getattr(OPS, name)] + ([getattr(OPS, name + "_out")] if hasattr(OPS, name + "_out") else [])
    taken = set()
    for form in forms:
        taken |= {a.name for a in form.default._schema.arguments}
    assert taken == set(public), (taken, public)


class DecodeStep(torch.nn.Module):
    """Insert, then logits + top-k, then decode: the ops chained as an engine would."""

    def forward(self, q, kv, positions, cos_sin, cache, slots, idx, lens, sink, idx_q, idx_cache, weights, ctx,
                table):
        OPS.qnorm_rope_kv_insert(q, kv, positions, cos_sin, cache, slots, layout="fp8_ds_mla", block_size=64, out=q)
        logits = OPS.paged_mqa_logits(idx_q, idx_cache, weights, ctx, table, 64, clean=True)
        top = OPS.indexer_topk(logits, 16, seq_lens=ctx, next_n=1)
        out, lse = OPS.sparse_mla_decode(q, cache, idx, lens, layout="fp8_ds_mla", block_size=64,
                                         softmax_scale=512 ** -0.5, attn_sink=sink)
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
