"""paged_mqa_logits' own tests: the reference against loops, an ``out`` overlapping ``weights``,
size limits and the grids CUDA cannot launch. Its error inputs are declared in its spec
(test_errors.py), its layouts and aliases generated (test_strides.py)."""
import pytest
import torch
from helpers import G, raises_input_error

import dsv4ops
from dsv4ops import formats
from dsv4ops.conformance import build_inputs

# --- the reference against loops -------------------------------------------------------------

def test_paged_logits_matches_loops(gen):
    kw = build_inputs("paged_mqa_logits", "cpu", gen, B=2, next_n=2, context=10, H=3, block_size=4, lens_dim=1)
    got = dsv4ops.reference.paged_mqa_logits(**kw)
    keys = formats.unpack_index_keys(kw["kv_cache"])
    for b in range(2):
        L = int(kw["context_lens"][b])
        for j in range(2):
            r = b * 2 + j
            for t in range(kw["max_context_len"]):
                if t >= L - 2 + j + 1:
                    continue
                k = keys[int(kw["block_table"][b, t // 4]), t % 4].double()
                want = sum(kw["weights"][r, h].item() * max(0.0, float(kw["q"][b, j, h].double() @ k)) for h in range(3))
                assert got[r, t].item() == pytest.approx(want, rel=1e-4, abs=1e-4)


# --- overlapping arguments -------------------------------------------------------------------

def test_logits_out_overlapping_weights():
    kw = build_inputs("paged_mqa_logits", "cpu", G(), B=2, next_n=1, context=32, H=4, block_size=16)
    rows, width = 2, kw["max_context_len"]
    buf = torch.zeros(rows * width + 8)
    buf[:8] = kw["weights"].flatten()
    kw["weights"], kw["out"] = buf[:8].view(2, 4), buf[4:4 + rows * width].view(rows, width)
    raises_input_error("paged_mqa_logits", kw, "out", "must not overlap 'weights'")


# --- size limits -----------------------------------------------------------------------------

def test_logits_huge_max_context_len():
    kw = build_inputs("paged_mqa_logits", "cpu", G(), B=2, next_n=1, context=32, H=4, block_size=16)
    kw["max_context_len"] = 2 ** 40
    raises_input_error("paged_mqa_logits", kw, "max_context_len", "at most")


def test_logits_zero_block_size_cache():
    kw = build_inputs("paged_mqa_logits", "cpu", G(), B=2, next_n=1, context=32, H=4, block_size=16)
    kw["kv_cache"] = torch.empty(7, 0, 1, 132, dtype=torch.uint8)
    raises_input_error("paged_mqa_logits", kw, "kv_cache", "block_size")


# --- launch limits ---------------------------------------------------------------------------

def test_triton_declines_grids_cuda_cannot_launch():
    kw = build_inputs("paged_mqa_logits", "cpu", G(), B=2, next_n=1, context=32, H=4, block_size=16)
    kw["max_context_len"] = 65536 * 128                      # sm90: 128 columns per program
    with dsv4ops.simulate_platform("cuda", "sm90"):
        decision = dsv4ops.explain("paged_mqa_logits", **kw)
    status = next(c.status for c in decision.candidates if c.backend == "triton")
    assert "CUDA allows 65535" in status
    kw["max_context_len"] = 65535 * 128
    with dsv4ops.simulate_platform("cuda", "sm90"):
        decision = dsv4ops.explain("paged_mqa_logits", **kw)
    assert "CUDA allows" not in next(c.status for c in decision.candidates if c.backend == "triton")


# --- MXFP4 keys and queries (DeepSeek-V4.1) ----------------------------------------------------

E2M1 = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)


def _mxfp4_loop(packed, scales) -> list[float]:
    """One 128-value vector from its 64 packed bytes and 4 UE8M0 bytes, element by element."""
    out = []
    for i in range(128):
        code = (int(packed[i // 2]) >> (4 * (i % 2))) & 0xF
        out.append((-1.0 if code & 8 else 1.0) * E2M1[code & 7] * 2.0 ** (int(scales[i // 32]) - 127))
    return out


def test_paged_logits_mxfp4_matches_loops(gen):
    """The reference on a 68 B cache with MXFP4 q against loops that decode every nibble themselves."""
    kw = build_inputs("paged_mqa_logits", "cpu", gen, B=2, next_n=2, context=6, H=3, block_size=4, lens_dim=2,
                      layout="index_mxfp4", q_fmt="mxfp4")
    got = dsv4ops.reference.paged_mqa_logits(**kw)
    values, scales = formats.index_key_views(kw["kv_cache"])
    checked = 0
    for b in range(2):
        for j in range(2):
            r = b * 2 + j
            for t in range(int(kw["context_lens"][b, j])):
                page, slot = int(kw["block_table"][b, t // 4]), t % 4
                k = _mxfp4_loop(values[page, slot], scales[page, slot])
                want = 0.0
                for h in range(3):
                    q = _mxfp4_loop(kw["q"][b, j, h], kw["q_scale"][b, j, h])
                    want += kw["weights"][r, h].item() * max(0.0, sum(x * y for x, y in zip(q, k, strict=True)))
                assert got[r, t].item() == pytest.approx(want, rel=1e-5, abs=1e-5)
                checked += 1
    assert checked > 4


def test_mxfp4_query_needs_mxfp4_keys_and_its_scales():
    kw = build_inputs("paged_mqa_logits", "cpu", G(), B=2, next_n=1, context=32, H=4, block_size=16,
                      layout="index_mxfp4", q_fmt="mxfp4")
    raises_input_error("paged_mqa_logits", {**kw, "q_scale": None}, "q_scale", "UE8M0 bytes")
    fp8_keys = formats.pack_index_keys(formats.unpack_index_keys(kw["kv_cache"]))
    raises_input_error("paged_mqa_logits", {**kw, "kv_cache": fp8_keys}, "q", "need MXFP4 keys")
    fp8_q = build_inputs("paged_mqa_logits", "cpu", G(), B=2, next_n=1, context=32, H=4, block_size=16)["q"]
    raises_input_error("paged_mqa_logits", {**kw, "q": fp8_q}, "q_scale", "must be None for fp8 q")
