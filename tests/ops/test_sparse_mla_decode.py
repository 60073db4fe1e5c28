"""sparse_mla_decode's own tests: the reference against loops over the cache bytes, the sink,
arguments that overlap, scale and sink values. Its error inputs are declared in its spec
(test_errors.py), its layouts and aliases generated (test_strides.py)."""
import math
import struct

import pytest
import torch

import dsv4ops
from dsv4ops.conformance import build_inputs

from helpers import BAD_SCALES, G, raises_input_error


# --- the reference against loops -------------------------------------------------------------

def _decode_ds_mla_slot(cache, block_size, slot):
    """Decode one MODEL1 token by walking its bytes (docs/ops.md §1 layout A)."""
    page = cache[slot // block_size].tolist()
    off = slot % block_size
    data = page[off * 576:(off + 1) * 576]
    scale_row = page[block_size * 576 + off * 8: block_size * 576 + off * 8 + 8]
    fp8 = torch.tensor(data[:448], dtype=torch.uint8).view(torch.float8_e4m3fn).float().tolist()
    row = [fp8[i] * 2.0 ** (scale_row[i // 64] - 127) for i in range(448)]
    for i in range(64):
        lo, hi = data[448 + 2 * i], data[449 + 2 * i]
        row.append(struct.unpack("<f", struct.pack("<I", (hi << 24) | (lo << 16)))[0])
    return row


def test_sparse_decode_matches_loops(gen):
    kw = build_inputs("sparse_mla_decode", "cpu", gen, T=3, H=2, topk=8, layout="fp8_ds_mla", block_size=4,
                                  extra_topk=4, extra_block_size=2, corner="duplicates")
    out, lse = dsv4ops.reference.sparse_mla_decode(**kw)
    for t in range(3):
        keys = []
        for idx_name, len_name, cache_name, bs in (("indices", "topk_lens", "kv_cache", 4),
                                                   ("extra_indices", "extra_topk_lens", "extra_kv_cache", 2)):
            for j in range(kw[idx_name].shape[1]):
                i = int(kw[idx_name][t, j])
                if i != -1 and j < int(kw[len_name][t]):
                    keys.append(_decode_ds_mla_slot(kw[cache_name], bs, i))
        for h in range(2):
            q = kw["q"][t, h].double().tolist()
            scores = [sum(a * b for a, b in zip(q, k)) * kw["softmax_scale"] for k in keys]
            if not scores:
                assert lse[t, h].item() == math.inf and out[t, h].abs().max().item() == 0
                continue
            m = max(scores)
            z = sum(math.exp(s - m) for s in scores)
            ref_lse = m + math.log(z)
            sink = kw["attn_sink"][h].item()
            o = [sum(math.exp(s - ref_lse) * k[d] for s, k in zip(scores, keys)) for d in range(512)]
            factor = 1 / (1 + math.exp(sink - ref_lse))
            assert lse[t, h].item() == pytest.approx(ref_lse, rel=1e-5)
            assert out[t, h].float().tolist() == pytest.approx([v * factor for v in o], rel=2 ** -7, abs=1e-4)


def test_sink_and_lonely_edges(gen):
    kw = build_inputs("sparse_mla_decode", "cpu", gen, T=2, H=4, topk=8, layout="bf16", block_size=4, sink="inf",
                                  lens="full")
    out, lse = dsv4ops.reference.sparse_mla_decode(**kw)
    assert torch.all(out[:, 0::2] == 0)              # sink +inf: output 0, lse unchanged
    no_sink, lse2 = dsv4ops.reference.sparse_mla_decode(**{**kw, "attn_sink": None})
    assert torch.equal(out[:, 1::2], no_sink[:, 1::2])  # sink -inf: no effect
    assert torch.equal(lse, lse2)
    kw["indices"][:] = -1
    out, lse = dsv4ops.reference.sparse_mla_decode(**kw)
    assert torch.all(out == 0) and torch.all(lse == math.inf)


# --- overlapping arguments -------------------------------------------------------------------

def _decode(layout="bf16"):
    return build_inputs("sparse_mla_decode", "cpu", G(), T=3, H=4, topk=16, layout=layout, block_size=16)


def test_decode_out_viewing_cache():
    kw = _decode()
    kw["out"] = kw["kv_cache"].view(-1, 512)[:12].view(3, 4, 512)
    raises_input_error("sparse_mla_decode", kw, "out", "must not overlap 'kv_cache'")


def test_decode_cache_viewing_q():
    kw = _decode()
    shape, n = kw["kv_cache"].shape, kw["kv_cache"].numel()
    buf = kw["kv_cache"].flatten().clone()
    kw["kv_cache"] = buf.view(shape)
    kw["q"] = buf[512: 512 + kw["q"].numel()].view(kw["q"].shape)
    raises_input_error("sparse_mla_decode", kw, "kv_cache", "must not overlap 'q'")


# --- scale and sink values -------------------------------------------------------------------

@pytest.mark.parametrize("value", BAD_SCALES)
@pytest.mark.parametrize("name", ["kv_scale", "q_scale", "softmax_scale"])
def test_decode_scale_values(name, value):
    kw = _decode("fp8_per_tensor")
    kw[name] = value if name == "softmax_scale" else torch.tensor([value])
    raises_input_error("sparse_mla_decode", kw, name)


def test_decode_nan_sink():
    kw = _decode()
    kw["attn_sink"] = torch.tensor([0.0, float("nan"), float("inf"), -float("inf")])
    raises_input_error("sparse_mla_decode", kw, "attn_sink", "NaN")
