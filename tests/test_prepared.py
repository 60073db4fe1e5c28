"""dsv4ops.prepare: validate and choose once; checked and unchecked calls."""
import pytest
import torch

import dsv4ops
from dsv4ops.conformance.cases import make_case


def build(**params):
    return make_case("sparse_mla_decode", **params).build("cpu", seed=2)


def test_prepared_call_matches_dispatch_and_rejects_other_structures():
    kw = build(T=3, H=8, topk=32, layout="fp8_ds_mla", extra_topk=32, extra_block_size=2)
    prepared = dsv4ops.prepare("sparse_mla_decode", **kw, backend="reference")
    assert prepared.backend == "reference" and "reference" in repr(prepared)
    fresh = build(T=3, H=8, topk=32, layout="fp8_ds_mla", extra_topk=32, extra_block_size=2)
    tensors = {k: v for k, v in fresh.items() if isinstance(v, torch.Tensor)}
    want = dsv4ops.sparse_mla_decode(**fresh, backend="reference")
    for got in (prepared(**tensors), prepared.run(**tensors)):
        assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
    with pytest.raises(dsv4ops.InputError, match="prepare a new call"):
        prepared(**{**tensors, "q": tensors["q"][:2]})
    with pytest.raises(dsv4ops.InputError, match="argument 'indices'"):
        dsv4ops.prepare("sparse_mla_decode", **{**kw, "indices": kw["indices"].long()})
    with pytest.raises(dsv4ops.UnsupportedError):
        dsv4ops.prepare("sparse_mla_decode", **kw, backend="flashmla")


def test_prepared_errors_name_the_argument_and_the_difference():
    """A prepared call is bound to its shapes: a mismatch names the argument, what it is and what it
    was prepared as; positional arguments are refused with a dsv4ops error, not a bare TypeError."""
    kw = build(T=3, H=8, topk=32, layout="fp8_ds_mla")
    prepared = dsv4ops.prepare("sparse_mla_decode", **kw, backend="reference")
    q = kw["q"]
    with pytest.raises(dsv4ops.InputError, match=r"argument 'q' is bfloat16 \[2, 8, 512\].*prepared with bfloat16 \[3, 8, 512\]"):
        prepared(q=q[:2])
    with pytest.raises(dsv4ops.InputError, match=r"argument 'q' is float32 \[3, 8, 512\]"):
        prepared(q=q.float())
    with pytest.raises(dsv4ops.InputError, match=r"argument 'indices' is int32 \[3, 32\] strides \(64, 2\).*prepared with int32 \[3, 32\] strides \(32, 1\)"):
        prepared(indices=torch.cat([kw["indices"], kw["indices"]], -1)[..., ::2])
    for method in (prepared, prepared.run):
        with pytest.raises(dsv4ops.InputError, match="keyword arguments only"):
            method(q)
    with pytest.raises(dsv4ops.InputError, match="nope"):
        prepared(nope=q)
