"""sparse_mla_prefill's own tests: its reference is the decode reference in token chunks. Its
error inputs are declared in its spec (test_errors.py), its layouts and aliases generated
(test_strides.py)."""
import importlib

import torch

import dsv4ops
from dsv4ops.conformance import build_inputs


def test_prefill_reference_is_decode_in_chunks(monkeypatch):
    """The prefill reference, split into token chunks, equals the decode reference bit for bit
    (out= filled in place, lse per chunk, need_lse honoured)."""
    monkeypatch.setattr(importlib.import_module("dsv4ops.reference.impl.sparse_mla_prefill"), "CHUNK_ELEMENTS", 3 * 96 * 512)
    kw = build_inputs("sparse_mla_decode", "cpu", torch.Generator().manual_seed(5), T=7, H=4, topk=32, layout="fp8_ds_mla",
                                  extra_topk=64, extra_block_size=16, corner="zero_len")
    out_d, lse_d = dsv4ops.reference.sparse_mla_decode(**kw)
    buf = torch.full_like(out_d, float("nan"))
    out_p, lse_p = dsv4ops.reference.sparse_mla_prefill(**kw, out=buf)
    assert out_p is buf and torch.equal(out_p, out_d) and torch.equal(lse_p, lse_d)
    assert dsv4ops.reference.sparse_mla_prefill(**{**kw, "need_lse": False})[1] is None
