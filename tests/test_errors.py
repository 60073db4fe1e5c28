"""Error inputs per op (the OpInfo ``error_inputs`` model): each raises InputError naming the
argument, before any kernel runs, leaving every caller buffer untouched."""
import pytest
import torch

import dsv4ops
from dsv4ops.conformance import inputs

G = lambda: torch.Generator().manual_seed(7)


def base(op):
    return {
        "qnorm_rope_kv_insert": lambda: inputs.qnorm_rope_kv_insert("cpu", G(), T=4, H=4, layout="fp8_ds_mla",
                                                                     block_size=16, num_blocks=2),
        "sparse_mla_decode": lambda: inputs.sparse_mla_decode("cpu", G(), T=3, H=4, topk=16, layout="fp8_ds_mla",
                                                               block_size=16, extra_topk=8, extra_block_size=2),
        "sparse_mla_prefill": lambda: inputs.sparse_mla_decode("cpu", G(), T=5, H=16, topk=16, layout="fp8_ds_mla",
                                                                block_size=16, extra_topk=8, extra_block_size=2),
        "paged_mqa_logits": lambda: inputs.paged_mqa_logits("cpu", G(), B=2, next_n=2, context=32, H=4,
                                                             block_size=16),
        "fp8_einsum": lambda: inputs.fp8_einsum("cpu", G(), B=2, H=2, D=128, R=256),
        "indexer_topk": lambda: inputs.indexer_topk("cpu", G(), R=4, W=64, k=8, mode="ranges"),
        "mqa_logits": lambda: inputs.mqa_logits("cpu", G(), T=5, S=40, H=4, ranges="random"),
        "inv_rope_fp8_quant": lambda: inputs.inv_rope_fp8_quant("cpu", G(), T=3, H=4, n_groups=2, max_pos=64),
        "compress_kv_insert": lambda: inputs.compress_kv_insert("cpu", G(), layout="fp8_ds_mla", ratio=4,
                                                                reqs=((2, 6), (9, 1)), block_size=4),
    }[op]()


def _set(**changes):
    return lambda kw: kw.update(changes)


def _with(name, fn):
    return lambda kw: kw.update({name: fn(kw[name])})


ERRORS = {
    "qnorm_rope_kv_insert": [
        ("q", _with("q", lambda t: t.float())),
        ("q", _with("q", lambda t: t[..., :256].contiguous())),
        ("q", _with("q", lambda t: torch.zeros(4, 129, 512, dtype=torch.bfloat16))),
        ("q", _with("q", lambda t: t.transpose(0, 1).contiguous().transpose(0, 1))),
        ("kv", _with("kv", lambda t: t[:3])),
        ("positions", _with("positions", lambda t: t.int())),
        ("positions", _with("positions", lambda t: t + 10_000)),
        ("cos_sin_cache", _with("cos_sin_cache", lambda t: t[:, :32].contiguous())),
        ("layout", _set(layout="fp8")),
        ("kv_cache", _with("kv_cache", lambda t: t[:, :-1].contiguous())),
        ("kv_cache", _set(layout="bf16")),
        ("slot_mapping", _with("slot_mapping", lambda t: torch.cat([t, t]))),
        ("slot_mapping", _with("slot_mapping", lambda t: t.clamp_min(0) + 32)),
        ("block_size", _set(block_size=0)),
        ("eps", _set(eps=-1.0)),
        ("out", _set(out=torch.empty(4, 4, 256, dtype=torch.bfloat16))),
    ],
    "sparse_mla_decode": [
        ("q", _with("q", lambda t: t.float())),
        ("q", _with("q", lambda t: torch.zeros(3, 0, 512, dtype=torch.bfloat16))),
        ("indices", _with("indices", lambda t: t.long())),
        ("indices", _with("indices", lambda t: t[:2])),
        ("indices", _with("indices", lambda t: torch.where(t == -1, -2, t))),
        ("indices", _with("indices", lambda t: t.clamp_min(0) + 10_000)),
        ("topk_lens", _with("topk_lens", lambda t: t + 100)),
        ("extra_topk_lens", _with("extra_topk_lens", lambda t: t + 100)),
        ("attn_sink", _with("attn_sink", lambda t: t[:2])),
        ("attn_sink", _with("attn_sink", lambda t: t.double())),
        ("softmax_scale", _set(softmax_scale="0.04")),
        ("extra_indices", _set(extra_indices=None)),
        ("extra_kv_cache", _set(extra_kv_cache=None)),
        ("extra_kv_cache", _set(extra_block_size=4)),
        ("kv_cache", _set(layout="bf16")),
        ("layout", _set(layout="fp8")),
        ("out", _set(out=torch.empty(3, 4, 512))),
    ],
    "sparse_mla_prefill": [
        ("q", _with("q", lambda t: t.float())),
        ("q", _with("q", lambda t: torch.zeros(5, 129, 512, dtype=torch.bfloat16))),
        ("q", _with("q", lambda t: t[..., :256].contiguous())),
        ("indices", _with("indices", lambda t: t.long())),
        ("indices", _with("indices", lambda t: t[:4])),
        ("indices", _with("indices", lambda t: torch.where(t == -1, -7, t))),
        ("extra_indices", _with("extra_indices", lambda t: t.clamp_min(0) + 1000)),
        ("topk_lens", _with("topk_lens", lambda t: t - 100)),
        ("extra_topk_lens", _with("extra_topk_lens", lambda t: t[:2])),
        ("attn_sink", _with("attn_sink", lambda t: torch.full_like(t, float("nan")))),
        ("attn_sink", _with("attn_sink", lambda t: t[:8])),
        ("softmax_scale", _set(softmax_scale=0.0)),
        ("extra_indices", _set(extra_indices=None)),
        ("extra_kv_cache", lambda kw: kw.update(extra_kv_cache=None, extra_indices=None, extra_topk_lens=None)),
        ("block_size", _set(block_size=0)),
        ("out", _set(out=torch.empty(5, 16, 512, dtype=torch.float16))),
        ("need_lse", _set(need_lse="no")),
    ],
    "paged_mqa_logits": [
        ("q", _with("q", lambda t: t.float())),
        ("q", _with("q", lambda t: t[..., :64].contiguous())),
        ("kv_cache", _with("kv_cache", lambda t: t[..., :128].contiguous())),
        ("weights", _with("weights", lambda t: t[:1])),
        ("weights", _with("weights", lambda t: t.bfloat16())),
        ("context_lens", _with("context_lens", lambda t: t.long())),
        ("context_lens", _with("context_lens", lambda t: t[:1])),
        ("context_lens", _with("context_lens", lambda t: t + 1000)),
        ("context_lens", _with("context_lens", lambda t: t - 1000)),
        ("block_table", _with("block_table", lambda t: t.long())),
        ("block_table", _with("block_table", lambda t: t + 1000)),
        ("max_context_len", _set(max_context_len=-1)),
        ("clean", _set(clean="yes")),
        ("out", _set(out=torch.empty(3, 32))),
    ],
    "fp8_einsum": [
        ("equation", _set(equation="bhr,hrd->bhd")),
        ("a", _with("a", lambda t: t.float())),
        ("a", _with("a", lambda t: t[..., :100])),
        ("b", _with("b", lambda t: t[:1])),
        ("b", _with("b", lambda t: t.transpose(1, 2).contiguous().transpose(1, 2))),
        ("b", _with("b", lambda t: t[:, :100].contiguous())),
        ("a_scale", _with("a_scale", lambda t: t[..., :1])),
        ("a_scale", _with("a_scale", lambda t: t.double())),
        ("b_scale", _with("b_scale", lambda t: t.reshape(2, 2, 1))),
        ("out_dtype", _set(out_dtype=torch.float16)),
        ("out", _set(out=torch.empty(2, 2, 128))),
    ],
    "indexer_topk": [
        ("logits", _with("logits", lambda t: t.double())),
        ("logits", _with("logits", lambda t: t[0])),
        ("k", _set(k=0)),
        ("k", _set(k=8.0)),
        ("row_ends", _set(row_ends=None)),
        ("row_starts", _with("row_starts", lambda t: t.long())),
        ("row_ends", _with("row_ends", lambda t: t + 1000)),
        ("row_starts", _with("row_starts", lambda t: t - 1000)),
        ("row_starts", lambda kw: kw.update(row_starts=torch.full_like(kw["row_starts"], 9),
                                            row_ends=torch.full_like(kw["row_ends"], 5))),
        ("seq_lens", _set(seq_lens=torch.tensor([3, 4], dtype=torch.int32))),
        ("seq_lens", lambda kw: kw.update(row_starts=None, row_ends=None, seq_lens=torch.ones(3, dtype=torch.int32))),
        ("next_n", lambda kw: kw.update(row_starts=None, row_ends=None, next_n=3,
                                        seq_lens=torch.ones(2, 2, dtype=torch.int32))),
        ("next_n", _set(next_n=0)),
        ("out", _set(out=torch.empty(4, 8, dtype=torch.int64))),
    ],
    "compress_kv_insert": [
        ("layout", _set(layout="bf16")),
        ("ratio", _set(ratio=8)),
        ("kv", _with("kv", lambda t: t[:, :512])),
        ("kv", _with("kv", lambda t: t.half())),
        ("score", _with("score", lambda t: t[:3])),
        ("positions", _with("positions", lambda t: t.int())),
        ("positions", _with("positions", lambda t: t + 1000)),
        ("ape", _with("ape", lambda t: t[:2].contiguous())),
        ("norm_weight", _with("norm_weight", lambda t: t[:128].contiguous())),
        ("cos_sin_cache", _with("cos_sin_cache", lambda t: t.double())),
        ("state_cache", _with("state_cache", lambda t: t[..., :1024].contiguous())),
        ("state_slot_mapping", _with("state_slot_mapping", lambda t: t + 1000)),
        ("state_block_table", _with("state_block_table", lambda t: t + 1000)),
        ("token_to_req", _with("token_to_req", lambda t: t + 5)),
        ("token_to_req", _with("token_to_req", lambda t: t.long())),
        ("kv_cache", _set(block_size=8)),
        ("slot_mapping", _with("slot_mapping", lambda t: t[:2])),
        ("slot_mapping", _with("slot_mapping", lambda t: t + 1000)),
        ("eps", _set(eps=0.0)),
    ],
    "inv_rope_fp8_quant": [
        ("o", _with("o", lambda t: t.float())),
        ("o", _with("o", lambda t: t[..., :448])),
        ("o", _with("o", lambda t: t[:, :0])),
        ("o", _with("o", lambda t: t[:, :3])),
        ("o", _with("o", lambda t: t[0])),
        ("positions", _with("positions", lambda t: t.int())),
        ("positions", _with("positions", lambda t: t[:2])),
        ("positions", _with("positions", lambda t: t + 64)),
        ("positions", _with("positions", lambda t: t - 64)),
        ("cos_sin_cache", _with("cos_sin_cache", lambda t: t[:, :32].contiguous())),
        ("cos_sin_cache", _with("cos_sin_cache", lambda t: t.double())),
        ("n_groups", _set(n_groups=0)),
        ("n_groups", _set(n_groups=2.0)),
    ],
    "mqa_logits": [
        ("q", _with("q", lambda t: t.float())),
        ("q", _with("q", lambda t: t[..., :64].contiguous())),
        ("q", _with("q", lambda t: t.transpose(0, 1).contiguous().transpose(0, 1))),
        ("k", _with("k", lambda t: t.view(torch.uint8))),
        ("k", _with("k", lambda t: t.float().to(torch.float8_e4m3fnuz))),
        ("k", _with("k", lambda t: t[:, :64].contiguous())),
        ("k_scale", _with("k_scale", lambda t: t[:-1])),
        ("k_scale", _with("k_scale", lambda t: t.double())),
        ("weights", _with("weights", lambda t: t[:, :2])),
        ("weights", _with("weights", lambda t: t.bfloat16())),
        ("ks", _with("ks", lambda t: t.long())),
        ("ke", _with("ke", lambda t: t[:3])),
        ("ke", _with("ke", lambda t: t + 1000)),
        ("ks", _with("ks", lambda t: t - 1000)),
        ("ks", lambda kw: kw.update(ks=torch.full_like(kw["ks"], 9), ke=torch.full_like(kw["ke"], 5))),
        ("clean", _set(clean="yes")),
        ("out", _set(out=torch.empty(5, 39))),
        ("out", _set(out=torch.empty(5, 40, dtype=torch.float64))),
    ],
}

CASES = [(op, arg, fn) for op, errs in ERRORS.items() for arg, fn in errs]


def test_at_least_ten_error_inputs_per_op():
    assert all(len(v) >= 10 for v in ERRORS.values())


@pytest.mark.parametrize("op,arg,mutate", CASES, ids=[f"{op}-{arg}-{i}" for i, (op, arg, _) in enumerate(CASES)])
def test_error_input(op, arg, mutate):
    kw = base(op)
    dsv4ops.explain(op, **kw)                           # the unmodified call is valid
    mutate(kw)
    before = {k: v.clone() for k, v in kw.items() if isinstance(v, torch.Tensor)}
    with pytest.raises(dsv4ops.InputError, match=f"{op}: argument '{arg}'"):
        dsv4ops.dispatch(op, **kw)
    for name, tensor in before.items():                 # nothing written to caller buffers
        assert torch.equal(kw[name].view(torch.uint8) if kw[name].dim() else kw[name], tensor.view(torch.uint8)
                           if tensor.dim() else tensor) or torch.equal(kw[name].isnan(), tensor.isnan()), name


def test_input_error_is_value_error():
    assert issubclass(dsv4ops.InputError, ValueError)


def test_value_checks_skipped_on_gpu_without_debug(env, monkeypatch):
    from dsv4ops.checker import Checker
    env(DSV4OPS_DEBUG="1")
    assert Checker("x").debug
    env(DSV4OPS_DEBUG="0")
    assert not Checker("x").debug
