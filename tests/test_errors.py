"""Error inputs per op (the OpInfo ``error_inputs`` model, declared in each op's spec): each raises
InputError naming the argument, before any kernel runs, leaving every caller buffer untouched."""
import pytest
import torch

import dsv4ops
from dsv4ops.conformance import build_inputs
from dsv4ops.ops import OPS

CASES = [(op.name, arg, change) for op in OPS.values() for arg, change in op.spec.conformance.errors]


def base(op: str) -> dict:
    """A valid call of ``op``: its spec's ``conformance.error_base``."""
    return build_inputs(op, "cpu", torch.Generator().manual_seed(7), **OPS[op].spec.conformance.error_base)


def test_at_least_ten_error_inputs_per_op():
    assert all(len(op.spec.conformance.errors) >= 10 for op in OPS.values())


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


def _extra_state_slot(kw):
    kw["state_slot_mapping"] = torch.cat([kw["state_slot_mapping"], kw["state_slot_mapping"][:1]])


def _rows_not_b_times_next_n(kw):
    kw.update(row_starts=None, row_ends=None, next_n=2, seq_lens=torch.full((2,), 8, dtype=torch.int32))
    kw["logits"] = kw["logits"][:3]


# Messages that name the argument at fault and say what is wrong in its terms (issue 49).
MESSAGES = [
    ("compress_kv_insert", _extra_state_slot,
     r"argument 'state_slot_mapping' must have at most T=7 entries \(T': one per token that writes, T' <= T\)"),
    ("compress_kv_insert", lambda kw: kw.update(block_size=8),
     r"argument 'kv_cache' must be \[num_blocks, 5184\] for block_size=8 tokens of fp8_ds_mla, got uint8 "
     r"\[3, 2880\] on cpu: is block_size the cache's page size\?"),
    ("qnorm_rope_kv_insert", lambda kw: kw.update(slot_mapping=kw["slot_mapping"][:, None]),
     r"argument 'slot_mapping' must be int64 \[T' \(tokens written, <= T\)\]"),
    ("indexer_topk", _rows_not_b_times_next_n,
     r"argument 'seq_lens' describes B=2 requests x next_n=2 = 4 rows, but the call has R=3 rows"),
]


@pytest.mark.parametrize("op,mutate,message", MESSAGES, ids=[f"{op}-{i}" for i, (op, _, _) in enumerate(MESSAGES)])
def test_error_message(op, mutate, message):
    kw = base(op)
    mutate(kw)
    with pytest.raises(dsv4ops.InputError, match=f"{op}: {message}"):
        dsv4ops.dispatch(op, **kw)


def test_device_mix_names_the_odd_one_out():
    """The first tensor on another device than the rest is named, not the second one checked."""
    kw = base("sparse_mla_decode")
    kw["q"] = kw["q"].to("meta")
    with pytest.raises(dsv4ops.InputError, match="argument 'q' must be on cpu like the other inputs, got .* on meta"):
        dsv4ops.dispatch("sparse_mla_decode", **kw)
