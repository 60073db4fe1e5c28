"""qnorm_rope_kv_insert's own tests: the reference against loops, arguments that overlap (and
``out=q``, the in-place form the contract allows), scale and eps values. Its error inputs are
declared in its spec (test_errors.py), its layouts and aliases generated (test_strides.py)."""
import math

import pytest
import torch
from helpers import BAD_SCALES, G, bf16, raises_input_error

import dsv4ops
from dsv4ops.conformance import build_inputs

# --- the reference against loops -------------------------------------------------------------

def test_qnorm_rope_matches_loops(gen):
    kw = build_inputs("qnorm_rope_kv_insert", "cpu", gen, T=3, H=2, layout="bf16", block_size=4, num_blocks=2, skip_slots=0)
    q0, kv = kw["q"].clone(), kw["kv"]
    out = dsv4ops.reference.qnorm_rope_kv_insert(**kw)
    cs = kw["cos_sin_cache"]
    for t in range(3):
        p = int(kw["positions"][t])
        for h in range(2):
            x = q0[t, h].double().tolist()
            r = 1.0 / math.sqrt(sum(v * v for v in x) / 512 + 1e-6)
            y = [v * r for v in x]
            for i in range(32):
                c, s = cs[p, i].item(), cs[p, 32 + i].item()
                e, o = y[448 + 2 * i], y[449 + 2 * i]
                assert out[t, h, 448 + 2 * i].item() == pytest.approx(bf16(e * c - o * s), rel=2 ** -7, abs=1e-6)
                assert out[t, h, 449 + 2 * i].item() == pytest.approx(bf16(e * s + o * c), rel=2 ** -7, abs=1e-6)
            assert out[t, h, :448].float().tolist() == pytest.approx([bf16(v) for v in y[:448]], rel=2 ** -7)
        slot = int(kw["slot_mapping"][t])
        row = kw["kv_cache"][slot // 4, slot % 4]
        assert torch.equal(row[:448], kv[t, :448])
        for i in range(32):
            c, s = cs[p, i].item(), cs[p, 32 + i].item()
            e, o = kv[t, 448 + 2 * i].item(), kv[t, 449 + 2 * i].item()
            assert row[448 + 2 * i].item() == pytest.approx(bf16(e * c - o * s), rel=2 ** -7, abs=1e-6)


# --- overlapping arguments -------------------------------------------------------------------

def _qnorm(**kw):
    return build_inputs("qnorm_rope_kv_insert", "cpu", G(), T=4, H=1, block_size=16, num_blocks=2, **kw)


def test_qnorm_out_viewing_kv():
    kw = _qnorm(layout="bf16")
    kw["out"] = kw["kv"].view(4, 1, 512)
    raises_input_error("qnorm_rope_kv_insert", kw, "out", "must not overlap 'kv'")


def test_qnorm_cache_viewing_q():
    kw = _qnorm(layout="fp8_ds_mla")
    shape, n = kw["kv_cache"].shape, kw["kv_cache"].numel()
    buf = torch.zeros(n, dtype=torch.uint8)
    kw["kv_cache"] = buf.view(shape)
    kw["q"] = buf[4096: 4096 + 4 * 512 * 2].view(torch.bfloat16).view(4, 1, 512)
    raises_input_error("qnorm_rope_kv_insert", kw, "q", "must not overlap 'kv_cache'")        # written arguments in order


def test_qnorm_out_partly_overlapping_q():
    kw = _qnorm(layout="bf16")
    buf = torch.zeros(5, 1, 512, dtype=torch.bfloat16)
    buf[:4] = kw["q"]
    kw["q"], kw["out"] = buf[:4], buf[1:]
    raises_input_error("qnorm_rope_kv_insert", kw, "q", "must not overlap 'out'")


@pytest.mark.parametrize("backend", ["reference", "triton"])
def test_qnorm_out_is_q_in_place(backend):
    """``out=q`` (the very same view) is the in-place form the contract allows."""
    kw = _qnorm(layout="bf16")
    want = dsv4ops.qnorm_rope_kv_insert(**{**kw, "q": kw["q"].clone(), "kv_cache": kw["kv_cache"].clone()},
                                        backend="reference").clone()
    got = dsv4ops.qnorm_rope_kv_insert(**{**kw, "out": kw["q"]}, backend=backend)
    assert got.data_ptr() == kw["q"].data_ptr() and torch.equal(got, want)


# --- scale and eps values --------------------------------------------------------------------

@pytest.mark.parametrize("value", BAD_SCALES)
@pytest.mark.parametrize("name", ["kv_scale", "q_scale"])
def test_qnorm_scale_tensor_values(name, value):
    kw = _qnorm(layout="fp8_per_tensor")
    kw[name] = torch.tensor([value])
    raises_input_error("qnorm_rope_kv_insert", kw, name, "finite and > 0")


@pytest.mark.parametrize("value", [float("nan"), float("inf")])
def test_qnorm_eps_finite(value):
    kw = _qnorm(layout="bf16")
    kw["eps"] = value
    raises_input_error("qnorm_rope_kv_insert", kw, "eps")
