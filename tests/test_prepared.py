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
