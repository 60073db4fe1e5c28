"""sparse_mla_decode's own tests: the reference against loops over the cache bytes, the sink,
arguments that overlap, scale and sink values, and the corner cases (nothing selected, -1 inside a
row, NaN in unselected rows, sink None / +inf / -inf, padded head blocks, need_lse=False) on every
backend here. Its error inputs are declared in its spec (test_errors.py), its layouts and aliases
generated (test_strides.py), its whole quick tier run by test_conformance.py."""
import math
import struct

import pytest
import torch
from helpers import BACKENDS, BAD_SCALES, G, needs_triton, raises_input_error

import dsv4ops
from dsv4ops import formats
from dsv4ops.conformance import build_inputs, cases, run_case
from dsv4ops.conformance.cases import make_case
from dsv4ops.ops import OPS
from dsv4ops.shapes import ATTENTION_LAYOUTS

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
    shape = kw["kv_cache"].shape
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


# --- corner cases on every backend here, on the declared quick cases ---------------------------
# Each corner names the declared cases (dsv4ops/ops/sparse_mla_decode.py ``cases``) that hold it:
# a declaration that loses one fails here. Unselected cache rows hold NaN in every case (the input
# builder's ``filled_cache``), and -1 beyond a row's length alternates with slots of such rows.

HEAD_BLOCK = 16                 # the Triton tests below set decode_block_h to it
BUILDER_DEFAULTS = dict(sink="random", lens="random", corner=None, need_lse=True, extra_topk=0)
CORNERS = {
    "all_invalid": lambda p: p["corner"] == "all_invalid",
    "zero_len": lambda p: p["corner"] == "zero_len",
    "pad_middle": lambda p: p["corner"] == "pad_middle",
    "sink_inf": lambda p: p["sink"] == "inf",                 # +inf on even heads, -inf on odd ones
    "sink_none": lambda p: p["sink"] is None,
    "padded_heads": lambda p: p["T"] > 0 and p["H"] % HEAD_BLOCK != 0,
    "every_layout": lambda p: p["T"] > 0 and p["corner"] is None and p["sink"] == "random" and p["need_lse"],
    "no_lse": lambda p: not p["need_lse"],
}


def declared(corner: str) -> list:
    """The declared quick cases of sparse_mla_decode that hold ``corner``."""
    found = [c for c in cases("sparse_mla_decode", "quick")
             if "strided" not in c.kwargs and CORNERS[corner]({**BUILDER_DEFAULTS, **c.kwargs})]
    assert found, f"no declared quick case of sparse_mla_decode holds {corner!r}"
    return found


def call(kw: dict, backend: str, **change):
    """The public function on ``backend`` writing into a NaN-poisoned ``out`` (an element it does
    not write stays NaN); (out as fp32, lse)."""
    T, H, _ = kw["q"].shape
    out = torch.full((T, H, 512), float("nan"), dtype=torch.bfloat16)
    got, lse = dsv4ops.sparse_mla_decode(**{**kw, **change, "out": out}, backend=backend)
    assert got is out and not out.isnan().any(), "out not written everywhere"
    return got.float(), lse


def selected(kw: dict) -> torch.Tensor:
    """int [T]: the entries each token selects over both index lists (-1 and beyond-length excluded)."""
    count = 0
    for name, lens in (("indices", "topk_lens"), ("extra_indices", "extra_topk_lens")):
        idx = kw.get(name)
        if idx is not None:
            valid = idx >= 0
            if kw.get(lens) is not None:
                valid &= torch.arange(idx.shape[1]) < kw[lens][:, None]
            count = count + valid.sum(1)
    return count


def judge(params: dict, want_kwargs: dict, want, got_kwargs: dict, got) -> None:
    """The op's comparison rule (what the conformance suite applies)."""
    verdict = OPS["sparse_mla_decode"].spec.conformance.compare(params, want_kwargs, want, got_kwargs, got)
    assert verdict.ok, verdict.message


@needs_triton
@pytest.mark.parametrize("corner", list(CORNERS))
def test_declared_corner_matches_the_reference(env, corner):
    """The Triton backend against the reference on each declared case of the corner (``out``
    poisoned by run_case where the case passes one)."""
    env(DSV4OPS_TRITON_TUNING=f"decode_block_h={HEAD_BLOCK}")
    for case in declared(corner):
        result = run_case(case, "triton", "cpu", seed=3)
        assert result.status == "pass", f"{case.id}: {result.message}\nrerun: {result.reproducer()}"


@needs_triton
def test_heads_past_one_triton_head_block(env):
    """H = 20: a full head block, then one with 12 padded heads."""
    env(DSV4OPS_TRITON_TUNING=f"decode_block_h={HEAD_BLOCK}")
    case = make_case("sparse_mla_decode", T=3, H=20, topk=32, layout="fp8_ds_mla", block_size=16,
                     extra_topk=32, extra_block_size=16, out=True)
    result = run_case(case, "triton", "cpu", seed=3)
    assert result.status == "pass", f"{result.message}\nrerun: {result.reproducer()}"


@needs_triton
@pytest.mark.parametrize("main, extra", [("mxfp8_v41", "nvfp4_v41_inline"), ("mxfp8_v41_inline", "mxfp8_v41")])
def test_v41_pages_of_any_pitch(env, main, extra):
    """V4.1 pages of any width >= block_size * token_bytes: an odd pitch (records at unaligned
    addresses) with NaN bytes (0xFF) in the padding; Triton reads the records the reference reads."""
    env(DSV4OPS_TRITON_TUNING=f"decode_block_h={HEAD_BLOCK}")
    params = dict(T=3, H=8, topk=32, layout=main, block_size=16, extra_topk=32, extra_block_size=16,
                  extra_layout=extra)
    kw = make_case("sparse_mla_decode", **params).build("cpu", 5)
    for name, layout in (("kv_cache", main), ("extra_kv_cache", extra)):
        used = formats.Layout.of(layout).min_page_bytes(16)
        wide = torch.full((kw[name].shape[0], used + 13), 0xFF, dtype=torch.uint8)
        wide[:, :used] = kw[name][:, :used]
        kw[name] = wide
    want = dsv4ops.sparse_mla_decode(**kw, backend="reference")
    judge(params, kw, want, kw, dsv4ops.sparse_mla_decode(**kw, backend="triton"))


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("corner", ["all_invalid", "zero_len"])
def test_nothing_selected_gives_zeros_and_infinite_lse(backend, corner):
    """A token that selects nothing (every index -1, or both lengths 0): out 0 and lse +inf, sink or
    not; the other tokens unaffected."""
    for case in declared(corner):
        kw = case.build("cpu", 3)
        lonely = selected(kw) == 0
        assert lonely.any()
        out, lse = call(kw, backend)
        assert torch.all(out[lonely] == 0) and torch.all(lse[lonely] == math.inf)
        assert torch.isfinite(lse[~lonely]).all()


@pytest.mark.parametrize("backend", BACKENDS)
def test_minus_one_mid_row_is_skipped(backend):
    """-1 inside a row's valid prefix skips that entry and does not end the row: the same result as
    the lists with the valid entries moved to the front and the lengths cut to their count."""
    for case in declared("pad_middle"):
        kw = case.build("cpu", 3)
        compact = dict(kw)
        for name, lens in (("indices", "topk_lens"), ("extra_indices", "extra_topk_lens")):
            idx = kw[name]
            valid = (idx >= 0) & (torch.arange(idx.shape[1]) < kw[lens][:, None])
            order = torch.sort((~valid).int(), dim=1, stable=True).indices
            n = valid.sum(1)
            compact[name] = torch.where(torch.arange(idx.shape[1]) < n[:, None], idx.gather(1, order), -1)
            compact[lens] = n.to(torch.int32)
        assert not torch.equal(compact["indices"], kw["indices"])
        want = dsv4ops.sparse_mla_decode(**compact, backend="reference")
        judge(case.kwargs, compact, want, kw, dsv4ops.sparse_mla_decode(**kw, backend=backend))


@pytest.mark.parametrize("backend", BACKENDS)
def test_nan_in_rows_nothing_selects(backend):
    """NaN in the cache rows that are not selected (past a row's length, or never listed) reaches
    neither out nor lse, in every layout."""
    layouts = set()
    for case in declared("every_layout"):
        kw = case.build("cpu", 3)
        layouts.add(kw["layout"])
        slots = torch.arange(kw["kv_cache"].shape[0] * kw["block_size"])
        assert formats.read_kv(kw["kv_cache"], kw["layout"], kw["block_size"], slots).isnan().any()
        out, lse = call(kw, backend)
        assert torch.isfinite(out).all() and not lse.isnan().any()
    assert layouts == set(ATTENTION_LAYOUTS) | {"mxfp8_v41", "mxfp8_v41_inline"}


@pytest.mark.parametrize("backend", BACKENDS)
def test_sink_none_and_infinite(backend):
    """Sink +inf: out 0, lse as without a sink (lse excludes the sink); sink -inf: the same result
    as no sink, bit for bit."""
    for case in declared("sink_inf"):
        kw = case.build("cpu", 3)
        plus = kw["attn_sink"] == math.inf
        assert plus.any() and (kw["attn_sink"] == -math.inf).any()
        out, lse = call(kw, backend)
        none_out, none_lse = call(kw, backend, attn_sink=None)
        assert torch.all(out[:, plus] == 0) and torch.equal(out[:, ~plus], none_out[:, ~plus])
        if lse is not None:
            assert torch.equal(lse, none_lse)


@pytest.mark.parametrize("backend", BACKENDS)
def test_need_lse_false(backend):
    """``need_lse=False``: lse is None and out is the one ``need_lse=True`` gives."""
    for case in declared("no_lse"):
        kw = case.build("cpu", 3)
        out, lse = call(kw, backend)
        assert lse is None
        with_lse, lse = call(kw, backend, need_lse=True)
        assert lse is not None and torch.equal(out, with_lse)


@pytest.mark.parametrize("op", ["sparse_mla_decode", "sparse_mla_prefill"])
def test_extra_layout_none_on_the_fast_path(op, monkeypatch):
    """A repeated call (the fast path, no validation; on CPU too here) resolves ``extra_layout=None``
    to ``layout`` as the check does: two calls of one structure, the second on new values."""
    from dsv4ops import selection
    monkeypatch.setattr(selection, "skips_validation", lambda device: True)
    selection.clear_cache()
    params = dict(T=3, H=8, topk=64, layout="mxfp8_v41", extra_topk=64)
    for seed in (1, 2):
        kwargs = make_case(op, **params).build("cpu", seed)
        assert kwargs.get("extra_layout") is None and kwargs.get("extra_kv_cache") is not None
        got = OPS[op].function(**kwargs, backend="reference")
        want = OPS[op].function(**kwargs, extra_layout="mxfp8_v41", backend="reference")
        for g, w in zip(got, want):
            torch.testing.assert_close(g, w, equal_nan=True, rtol=0, atol=0)
    selection.clear_cache()
