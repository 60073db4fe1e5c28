"""The Triton compress_kv_insert paths the tunables choose (one program per window, or channel-group
pooling programs then the entry writes; several tokens per state-copy program), each against the
reference: conformance cases with token counts that do not divide by the copy's tokens per program."""
import pytest

import dsv4ops
from dsv4ops.conformance import run_case
from dsv4ops.conformance.cases import make_case

TRITON = any(b.name == "triton" and b.available for b in dsv4ops.backends())
CASES = [dict(layout="fp8_ds_mla", ratio=4, reqs=((0, 9), (5, 1), (7, 1), (30, 6)), block_size=4, pad=1, dp_pad=1),
         dict(layout="index_fp8", ratio=4, reqs=((2, 7), (11, 2), (0, 4)), block_size=8, skip_slot=True, pad=1),
         dict(layout="fp8_ds_mla", ratio=128, reqs=((100, 30), (127, 2), (0, 3)), block_size=2, pad=1, decode=3)]


@pytest.mark.skipif(not TRITON, reason="the Triton backend is not available here")
@pytest.mark.parametrize("tunables", [
    "compress_channels_c4=32,compress_chunk=4,compress_save_elems=4096",
    "compress_channels_c4=128,compress_channels_c128=512,compress_save_elems=512",
    "compress_channels_c128=16,compress_chunk=64,compress_pool_warps=2,compress_pool_tokens=1",
    "compress_channels_c4=64,compress_pool_tokens=4,compress_tokens=8",
    "compress_tokens=4,compress_channels_c128=1024"])
@pytest.mark.parametrize("params", CASES, ids=lambda p: f"{p['layout']}-C{p['ratio']}")
def test_compress_paths_match_the_reference(env, tunables, params):
    env(DSV4OPS_TRITON_TUNING=tunables)
    result = run_case(make_case("compress_kv_insert", **params), "triton", "cpu", seed=5)
    assert result.status == "pass", f"{result.message}\nrerun: {result.reproducer()}"
