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
