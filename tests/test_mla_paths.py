"""The Triton sparse MLA paths the tunables choose (programs over all 512 output columns or over
column blocks, each with the index list whole or split across programs and merged), each against the
reference on conformance cases of sparse_mla_decode and sparse_mla_prefill."""
import pytest

import dsv4ops
from dsv4ops.conformance import run_case
from dsv4ops.conformance.cases import C128_BLOCK, make_case

TRITON = any(b.name == "triton" and b.available for b in dsv4ops.backends())
C128 = dict(extra_topk=64, extra_block_size=C128_BLOCK)
CASES = {"decode-ds_mla": ("sparse_mla_decode", dict(T=3, H=5, topk=64, layout="fp8_ds_mla", **C128)),
         "decode-bf16-no_lse": ("sparse_mla_decode", dict(T=3, H=8, topk=64, layout="bf16", need_lse=False, **C128)),
         "decode-fp8_per_tensor": ("sparse_mla_decode", dict(T=3, H=5, topk=64, layout="fp8_per_tensor", **C128)),
         "decode-pad_middle": ("sparse_mla_decode", dict(T=3, H=8, topk=32, layout="fp8_ds_mla", extra_topk=64,
                                                         extra_block_size=16, corner="pad_middle")),
         "decode-all_invalid": ("sparse_mla_decode", dict(T=3, H=8, topk=32, layout="fp8_ds_mla", extra_topk=64,
                                                          extra_block_size=16, corner="all_invalid")),
         "decode-sink_inf-out": ("sparse_mla_decode", dict(T=2, H=16, topk=64, layout="fp8_ds_mla", sink="inf",
                                                           lens="full", out=True)),
         "prefill-ds_mla": ("sparse_mla_prefill", dict(T=2, H=20, topk=32, layout="fp8_ds_mla", extra_topk=64,
                                                       extra_block_size=16))}


@pytest.mark.skipif(not TRITON, reason="the Triton backend is not available here")
@pytest.mark.parametrize("split", [False, True], ids=["whole", "split"])
@pytest.mark.parametrize("tunables", ["decode_block_v=256,prefill_block_v=128",
                                      "decode_block_v=32,prefill_block_v=64,decode_block_k=32"])
@pytest.mark.parametrize("case", CASES)
def test_column_blocks_match_the_reference(env, monkeypatch, tunables, split, case):
    """``split``: every index list split in three (the last part shorter), partials merged per column block."""
    from dsv4ops.backends.triton import sparse_mla_decode
    env(DSV4OPS_TRITON_TUNING=tunables)
    if split:
        monkeypatch.setattr(sparse_mla_decode, "choose_splits", lambda programs, blocks, device, waves: min(3, blocks))
    op, params = CASES[case]
    result = run_case(make_case(op, **params), "triton", "cpu", seed=11)
    assert result.status == "pass", f"{result.message}\nrerun: {result.reproducer()}"
