"""Contract tests for vendor paths that cannot run on this machine: the adapter's own code runs end
to end against a fake of the vendor entry point (tests/fakes), judged by the conformance rules on
a simulated platform; and the capability checks decline where the vendor kernel cannot run."""
import ast
import collections
import functools
import importlib
import importlib.metadata
import inspect
import re
import sys
from pathlib import Path

import pytest
import torch
from fakes import flashinfer as fake_flashinfer
from fakes import reprobed

import dsv4ops
from dsv4ops import formats
from dsv4ops.backend_support import declared_signature
from dsv4ops.conformance import cases, run_case
from dsv4ops.conformance.cases import make_case
from dsv4ops.formats import Layout
from dsv4ops.ops import OPS
from dsv4ops.opspec import DispatchKey


@pytest.fixture
def flashinfer(monkeypatch):
    fake_flashinfer.install(monkeypatch)
    with reprobed(monkeypatch, "flashinfer") as backend:
        yield backend


def _run_all(op, backend, arch):
    results = []
    with dsv4ops.simulate_platform("cuda", arch):
        for case in cases(op, "quick"):
            results.append(run_case(case, backend, "cpu", seed=11))
    ran = [r for r in results if r.status != "skip"]
    bad = [f"{r.case.id}: {r.message}" for r in ran if r.status != "pass"]
    assert not bad, bad
    return ran, results


def test_flashinfer_trtllm_decode_contract(flashinfer):
    ran, results = _run_all("sparse_mla_decode", "flashinfer", "sm100")
    assert {r.case.kwargs["layout"] for r in ran} == {"bf16", "fp8_per_tensor"}
    skipped = {r.case.id: r.message for r in results if r.status == "skip"}
    assert any("need_lse=False" in m for m in skipped.values())
    assert any("layout fp8_ds_mla" in m for m in skipped.values())
    narrow = make_case("sparse_mla_decode", **dict(T=2, H=8, topk=64, layout="bf16", need_lse=False))
    with dsv4ops.simulate_platform("cuda", "sm100"):
        assert "SWA index width 64 != 128" in run_case(narrow, "flashinfer", "cpu").message


def test_flashinfer_sm120_decode_contract(flashinfer):
    ran, _ = _run_all("sparse_mla_decode", "flashinfer", "sm120")
    assert ran and all(r.case.kwargs["layout"] == "fp8_ds_mla" for r in ran)
    assert any(r.case.kwargs.get("sink") == "inf" for r in ran)           # sink applied in the adapter


def test_flashinfer_topk_contract(flashinfer):
    ran, results = _run_all("indexer_topk", "flashinfer", "sm90")
    assert len(ran) == len(results)


def test_flashinfer_decode_declines_on_sm90(flashinfer):
    kw = make_case("sparse_mla_decode", T=2, H=8, topk=128, layout="bf16", need_lse=False).build("cpu", 0)
    with dsv4ops.simulate_platform("cuda", "sm90"):
        d = dsv4ops.explain("sparse_mla_decode", **kw, backend="flashinfer")
        assert d.selected is None
        statuses = {c.implementation: c.status for c in d.candidates}
        assert "runs on sm100" in statuses["flashinfer.trtllm_gen"] and "runs on sm120" in statuses["flashinfer.sm120"]
        with pytest.raises(dsv4ops.UnsupportedError, match="flashinfer.trtllm_gen: arch sm90"):
            dsv4ops.sparse_mla_decode(**kw, backend="flashinfer")


def test_flashinfer_trtllm_table_padding_and_lonely_rows(flashinfer):
    """0.7.x wants the table width % 4 == 0 (padded with -1) and seq_lens >= 1 (validated)."""
    extra = [make_case("sparse_mla_decode", T=4, H=8, topk=128, layout=layout, extra_topk=62, extra_block_size=2,
                       need_lse=False, corner=corner) for layout in ("bf16", "fp8_per_tensor")
             for corner in (None, "zero_len", "all_invalid")]
    with dsv4ops.simulate_platform("cuda", "sm100"):
        results = [run_case(c, "flashinfer", "cpu", seed=3) for c in extra]
    assert all(r.status == "pass" for r in results), [r.message for r in results]


@pytest.fixture
def flashmla(monkeypatch):
    from fakes import flashmla as fake_flashmla
    fake_flashmla.install(monkeypatch)
    with reprobed(monkeypatch, "flashmla") as backend:
        yield backend


@pytest.mark.parametrize("arch", ["sm90", "sm100"])
def test_flashmla_prefill_contract(flashmla, arch):
    """flash_mla_sparse_fwd over the gathered bf16 workspace: both segments in one index list padded
    to the index tile, heads padded to 64 / 128, lengths as -1 entries, natural-log lse."""
    ran, results = _run_all("sparse_mla_prefill", "flashmla", arch)
    assert {r.case.kwargs["layout"] for r in ran} == {"fp8_ds_mla", "bf16"}
    assert any(r.case.kwargs.get("corner") == "all_invalid" for r in ran)
    skipped = [r.message for r in results if r.status == "skip"]
    assert skipped and all(m.startswith(("layout fp8_per_tensor", "layout mxfp8_v41")) for m in skipped)
    assert all("no sparse prefill over the V4.1 records" in m for m in skipped if m.startswith("layout mxfp8_v41"))


def test_flashmla_prefill_declines_without_sink(monkeypatch, flashmla):
    """A FlashMLA whose flash_mla_sparse_fwd predates the attention sink (DeepSeek-V3.2 builds)."""
    from fakes import flashmla as fake_flashmla

    def flash_mla_sparse_fwd(q, kv, indices, sm_scale, d_v=512):
        raise AssertionError("must not be called")
    fake_flashmla.install(monkeypatch, sparse_fwd=flash_mla_sparse_fwd)
    case = make_case("sparse_mla_prefill", T=2, H=8, topk=64, layout="fp8_ds_mla")
    with dsv4ops.simulate_platform("cuda", "sm90"):
        assert "takes no attn_sink" in run_case(case, "flashmla", "cpu").message


def test_flashmla_sm100_topk_tiles():
    """On SM100 FlashMLA walks h128 index lists in tiles of 128: a 64-wide list is declined there."""
    from dsv4ops.backends.flashmla import topk_multiple
    kw = make_case("sparse_mla_decode", **dict(T=1, H=128, topk=64, layout="fp8_ds_mla")).build("cpu", 0)
    call = dsv4ops.OPS["sparse_mla_decode"].validate_call(**kw).key
    with dsv4ops.simulate_platform("cuda", "sm100"):
        assert "multiple of 128" in topk_multiple(dsv4ops.platform(), call)
    with dsv4ops.simulate_platform("cuda", "sm90"):
        assert topk_multiple(dsv4ops.platform(), call) is None


# FlashMLA on the V4.1 records (tokenspeed-flashmla 1.0.0.post20260924): contract-tested only (no SM100 here).
V41_LAYOUTS = {name: layout for name, layout in formats.LAYOUTS.items() if layout.is_v41}
_DecodeArgs = collections.namedtuple("_DecodeArgs", "q kv_cache indices topk_lens attn_sink layout block_size "
                                     "extra_kv_cache extra_indices extra_topk_lens extra_block_size extra_layout "
                                     "softmax_scale need_lse out")


def v41_decode_args(layout="mxfp8_v41", extra_layout="nvfp4_v41", T=3, H=8, topk=64, extra_topk=128, bs=64,
                    extra_bs=32, pages=(None, None), padded=False, seed=0):
    """sparse_mla_decode arguments on V4.1 caches; ``pages`` the page widths (None: bs * token_bytes, plus
    one ``page_align`` if ``padded``);
    random bytes (the fake does not read them), per-query lengths, a random sink."""
    g = torch.Generator().manual_seed(seed)
    main, extra = V41_LAYOUTS[layout], extra_layout and V41_LAYOUTS[extra_layout]

    def cache(lay, block, width, tokens):
        nb = -(-tokens // block)
        width = width or block * lay.token_bytes + (lay.page_align if padded else 0)
        return torch.randint(0, 256, (nb, width), dtype=torch.uint8, generator=g)

    def idx(k, tokens):
        return torch.randint(-1, tokens, (T, k), dtype=torch.int32, generator=g)

    def lens(k):
        return torch.randint(0, k + 1, (T,), dtype=torch.int32, generator=g)
    return _DecodeArgs(
        q=torch.randn(T, H, 512, generator=g).bfloat16(), kv_cache=cache(main, bs, pages[0], 4 * bs),
        indices=idx(topk, 4 * bs), topk_lens=lens(topk), attn_sink=torch.randn(H, generator=g), layout=main,
        block_size=bs, extra_kv_cache=extra and cache(extra, extra_bs, pages[1], 8 * extra_bs),
        extra_indices=extra and idx(extra_topk, 8 * extra_bs), extra_topk_lens=extra and lens(extra_topk),
        extra_block_size=extra_bs, extra_layout=extra, softmax_scale=0.0441, need_lse=True, out=None)


@pytest.fixture
def flashmla_v41(monkeypatch):
    from fakes import flashmla as fake_flashmla
    calls = []
    fake_flashmla.install(monkeypatch, wrap=_recording(calls), v41=True)
    with reprobed(monkeypatch, "flashmla"):
        yield calls


def _v41_decline(a, arch):
    from dsv4ops.backends.flashmla import decode_records
    with dsv4ops.simulate_platform("cuda", arch):
        return decode_records(dsv4ops.platform(), DispatchKey("sparse_mla_decode", a, torch.device("cpu")))


def test_flashmla_api_generation():
    """The generation is read from what the module declares: 0615's interface reads V4 only, 0924's adds
    the fused-kernel module (and the V4.1 records), upstream's 2026-09-30 interface enable_batch_invariant."""
    from fakes import flashmla as fake_flashmla

    from dsv4ops.backends.flashmla import api_generation
    params = tuple(inspect.signature(fake_flashmla.flash_mla_with_kvcache).parameters)
    assert api_generation(params, False) == "v4"
    assert api_generation(params, True) == "v41"
    assert api_generation(params + ("enable_batch_invariant",), True) == "v41-inline"


@pytest.mark.parametrize("extra", ["nvfp4_v41", "mxfp8_v41", None])
@pytest.mark.parametrize("padded", [False, True, "strided"])
def test_flashmla_v41_decode_contract(flashmla_v41, extra, padded):
    """Argument mapping on V4.1 caches (padded and unpadded pages): each cache viewed as [nb, bs, 1, 528 /
    288] over its own bytes with its page pitch, indices [T, 1, k] and lengths [T] int32, heads and sink
    padded to 64, out [T, H, 512] bf16 and lse [T, H] from FlashMLA's [T, 1, Hp, 512] / [T, Hp, 1]."""
    from dsv4ops.backends.flashmla.decode import sparse_mla_decode
    a = _v41_pitched(extra, padded)
    assert _v41_decline(a, "sm100") is None
    with dsv4ops.simulate_platform("cuda", "sm100"):
        out, lse = sparse_mla_decode(a)
    assert out.shape == (3, 8, 512) and out.dtype == torch.bfloat16 and lse.shape == (3, 8)
    _, (path, args, kw) = flashmla_v41
    assert path == "flash_mla:flash_mla_with_kvcache"
    q, k_cache = args[:2]
    assert q.shape == (3, 1, 64, 512) and torch.equal(q[:, 0, :8], a.q) and not q[:, 0, 8:].any()
    for view, cache, bs, layout in ((k_cache, a.kv_cache, 64, a.layout),
                                    (kw.get("extra_k_cache"), a.extra_kv_cache, 32, a.extra_layout)):
        if cache is None:
            assert view is None
            continue
        assert view.shape == (cache.shape[0], bs, 1, layout.token_bytes) and view.stride(0) == cache.stride(0)
        assert view.data_ptr() == cache.data_ptr() and view.dtype == torch.uint8
    assert torch.equal(kw["indices"][:, 0], a.indices) and torch.equal(kw["topk_length"], a.topk_lens)
    assert torch.equal(kw["attn_sink"][:8], a.attn_sink) and (kw["attn_sink"][8:] == float("-inf")).all()
    if extra:
        assert torch.equal(kw["extra_indices_in_kvcache"][:, 0], a.extra_indices)
        assert torch.equal(kw["extra_topk_length"], a.extra_topk_lens)
    assert kw["softmax_scale"] == a.softmax_scale and kw["is_fp8_kvcache"] and not kw["causal"]


def _v41_pitched(extra, padded):
    """v41_decode_args with unpadded, padded or ("strided") unpadded pages inside a wider allocation,
    whose pitch is stride(0), not shape[1]."""
    a = v41_decode_args(extra_layout=extra, padded=padded is True)
    if padded == "strided":
        wide = torch.zeros(a.kv_cache.shape[0], a.kv_cache.shape[1] + 512, dtype=torch.uint8)
        wide[:, : a.kv_cache.shape[1]] = a.kv_cache
        a = a._replace(kv_cache=wide[:, : a.kv_cache.shape[1]])
    return a


@pytest.mark.parametrize("extra", ["nvfp4_v41", "mxfp8_v41", None])
@pytest.mark.parametrize("padded", [False, True, "strided"])
def test_flashmla_v41_decode_values(flashmla_v41, extra, padded):
    """On real records the adapter returns attention over what ``formats.read_kv`` (an independent reader of
    split pages of any pitch) decodes at the selected slots: -1 entries, lengths, a lonely row, the sink."""
    from fakes.flashinfer import _attend

    from dsv4ops.backends.flashmla.decode import sparse_mla_decode
    a = _v41_pitched(extra, padded)
    g = torch.Generator().manual_seed(1)
    segments = [(a.kv_cache, a.layout, a.block_size, a.indices, a.topk_lens)]
    if extra:
        segments.append((a.extra_kv_cache, a.extra_layout, a.extra_block_size, a.extra_indices, a.extra_topk_lens))
    keys, valid = [], []
    for cache, layout, bs, idx, lens in segments:
        slots = torch.arange(cache.shape[0] * bs)
        formats.write_kv(cache, layout, bs, slots, torch.randn(len(slots), 512, generator=g) * 3)
        lens[0] = 0                                       # row 0 selects nothing
        ok = (idx >= 0) & (torch.arange(idx.shape[1])[None, :] < lens[:, None])
        keys.append(formats.read_kv(cache, layout, bs, torch.where(ok, idx, 0)))
        valid.append(ok)
    expected, lse_expected = _attend(a.q.float(), torch.cat(keys, 1), torch.cat(valid, 1), a.softmax_scale, a.attn_sink)
    with dsv4ops.simulate_platform("cuda", "sm100"):
        out, lse = sparse_mla_decode(a)
    torch.testing.assert_close(out.float(), expected, atol=1e-2, rtol=1e-2)
    assert not out[0].any() and (lse[0] == float("inf")).all()
    torch.testing.assert_close(lse[1:], lse_expected[1:])


_V41_SPLIT = dict(T=16, H=64, topk=128, block_size=64, extra_topk=512, extra_block_size=64, layout="mxfp8_v41",
                  extra_layout="nvfp4_v41")
_V41_CASES = [c for c in cases("sparse_mla_decode", "full") if Layout.of(c.kwargs["layout"]).is_v41] + [
    make_case("sparse_mla_decode", **_V41_SPLIT, corner=corner, exact_pages=i % 2 == 0)
    for i, corner in enumerate(("all_invalid", "pad_middle", "duplicates", "zero_len"))] + [
    make_case("sparse_mla_decode", **dict(_V41_SPLIT, T=5, H=128, extra_layout="mxfp8_v41", sink="inf", out=True))]


def test_flashmla_v41_decode_conformance(flashmla_v41):
    """The op's V4.1 conformance cases (full tier: index widths FlashMLA's tiles accept) and split-page
    corner cases, judged against the reference by the op's rule on a simulated SM100; the inline-page
    cases are declined with the reason."""
    with dsv4ops.simulate_platform("cuda", "sm100"):
        results = [run_case(case, "flashmla", "cpu", seed=5) for case in _V41_CASES]
    ran = [r for r in results if r.status != "skip"]
    assert len(ran) >= 9 and all(r.status == "pass" for r in ran), [(r.case.id, r.message) for r in ran]
    assert all("inline pages; this flash_mla (API v41) reads split" in r.message for r in results if r.status == "skip")


@pytest.mark.parametrize("arch, a, reason", [
    ("sm90", dict(), "V4.1 kernels are SM100-only in this wheel"),
    ("sm120", dict(), "V4.1 kernels are SM100-only in this wheel"),
    ("sm100", dict(layout="mxfp8_v41_inline"), "layout mxfp8_v41_inline has inline pages; this flash_mla (API v41) "
                                               "reads split V4.1 pages"),
    ("sm100", dict(extra_layout="nvfp4_v41_inline"), "extra_layout nvfp4_v41_inline has inline pages"),
    ("sm100", dict(pages=(64 * 528 + 16, None)), "kv_cache page width 33808 B is not a multiple of 512 B"),
    ("sm100", dict(bs=24, pages=(None, None)), "kv_cache page width 12672 B is not a multiple of 512 B"),
    ("sm100", dict(extra_bs=4), "extra_kv_cache page width 1152 B is not a multiple of 256 B"),
])
def test_flashmla_v41_declines_with_the_reason(flashmla_v41, arch, a, reason):
    assert reason in _v41_decline(v41_decode_args(**a), arch)


def test_flashmla_v41_needs_a_v41_release(monkeypatch):
    """0615's interface (no fused-kernel module) reads no 528 / 288 B records; the inline generation
    reads inline pages and no longer the 584 B record."""
    from fakes import flashmla as fake_flashmla

    import dsv4ops.backends.flashmla as adapter
    fake_flashmla.install(monkeypatch)
    assert "reads no V4.1 records" in _v41_decline(v41_decode_args(), "sm100")
    monkeypatch.setattr(adapter, "api", lambda: "v41-inline")
    assert _v41_decline(v41_decode_args("mxfp8_v41_inline", "nvfp4_v41_inline"), "sm100") is None
    assert "reads inline V4.1 pages" in _v41_decline(v41_decode_args(), "sm100")
    kw = make_case("sparse_mla_decode", T=1, H=8, topk=64, layout="fp8_ds_mla").build("cpu", 0)
    call = dsv4ops.OPS["sparse_mla_decode"].validate_call(**kw).key
    with dsv4ops.simulate_platform("cuda", "sm100"):
        assert "dropped the V4 584 B record" in adapter.decode_records(dsv4ops.platform(), call)


_V41_PREFILL_LAYOUTS = [{"layout": "mxfp8_v41", "extra_layout": "nvfp4_v41"},
                        {"layout": "mxfp8_v41", "extra_layout": "mxfp8_v41"},
                        {"layout": "mxfp8_v41_inline", "extra_layout": "nvfp4_v41_inline"}, {"layout": "mxfp8_v41"}]


def _flashmla_generation(monkeypatch, generation, calls):
    """The fake of ``generation`` installed (the inline one: 0924's module with ``api`` reporting it)."""
    import dsv4ops.backends.flashmla as adapter
    from fakes import flashmla as fake_flashmla
    fake_flashmla.install(monkeypatch, wrap=_recording(calls), v41=generation != "v4")
    if generation == "v41-inline":
        monkeypatch.setattr(adapter, "api", lambda: "v41-inline")


@pytest.mark.parametrize("generation", ["v4", "v41", "v41-inline"])
@pytest.mark.parametrize("arch", ["sm90", "sm100"])
def test_flashmla_v41_prefill_declines(monkeypatch, generation, arch):
    """No generation's sparse prefill reads the 528 / 288 B records (flash_mla_sparse_fwd takes a bf16 kv;
    0924's V4.1 kernels are decode only): every V4.1 prefill call is declined with that reason before any
    vendor call, on SM90 and SM100, split and inline pages, each extra layout and none."""
    from dsv4ops.backends.flashmla import NO_V41_PREFILL
    calls = []
    _flashmla_generation(monkeypatch, generation, calls)
    with reprobed(monkeypatch, "flashmla"), dsv4ops.simulate_platform("cuda", arch):
        for layouts in _V41_PREFILL_LAYOUTS:
            extra = {"extra_topk": 128, "extra_block_size": 64} if "extra_layout" in layouts else {}
            kw = make_case("sparse_mla_prefill", T=3, H=64, topk=128, **layouts, **extra).build("cpu", 0)
            d = dsv4ops.explain("sparse_mla_prefill", **kw, backend="flashmla")
            reasons = [c.status for c in d.candidates if c.implementation.startswith("flashmla")]
            assert d.selected is None and len(reasons) == 1
            assert f"layout {layouts['layout']}: {NO_V41_PREFILL} (installed: API {generation})" in reasons[0]
            with pytest.raises(dsv4ops.UnsupportedError, match="no sparse prefill over the V4.1 records"):
                dsv4ops.sparse_mla_prefill(**kw, backend="flashmla")
    assert not calls


@pytest.mark.parametrize("generation, arch, runs", [
    ("v41", "sm90", True), ("v41", "sm103", True), ("v41-inline", "sm100", True),
    ("v41-inline", "sm90", False), ("v41", "sm120", False), ("v4", "sm120", False)])
def test_flashmla_prefill_arch_per_generation(monkeypatch, generation, arch, runs):
    """V4 prefill (the gathered workspace) on the arch each generation's flash_mla_sparse_fwd is built for:
    0924 keeps SM90 and SM100; upstream's inline generation raises on anything but SM100f."""
    from dsv4ops.backends.flashmla import PREFILL_ARCHS
    calls = []
    _flashmla_generation(monkeypatch, generation, calls)
    with reprobed(monkeypatch, "flashmla"):
        case = make_case("sparse_mla_prefill", T=3, H=16, topk=64, layout="fp8_ds_mla", extra_topk=64,
                         extra_block_size=16, corner="pad_middle")
        with dsv4ops.simulate_platform("cuda", arch):
            result = run_case(case, "flashmla", "cpu", seed=2)
    if runs:
        assert result.status == "pass", result.message
        assert [path for path, _, _ in calls] == ["flash_mla:flash_mla_sparse_fwd"]
    else:
        archs = ", ".join(PREFILL_ARCHS[generation])
        assert result.status == "skip" and not calls
        assert f"arch {arch}: this flash_mla (API {generation}) builds flash_mla_sparse_fwd for {archs} only" \
            in result.message


def test_flashmla_prefill_fake_checks_the_arch():
    """The fake refuses to run where the wheel has no sparse prefill kernels (and takes bf16 rows only)."""
    from fakes import flashmla as fake_flashmla
    q, kv, idx = torch.zeros(1, 64, 512).bfloat16(), torch.zeros(4, 1, 512).bfloat16(), torch.zeros(1, 1, 64).int()
    with dsv4ops.simulate_platform("cuda", "sm120"), pytest.raises(AssertionError, match="SM90 / SM100"):
        fake_flashmla.flash_mla_sparse_fwd(q, kv, idx, 0.04)
    with dsv4ops.simulate_platform("cuda", "sm100"), pytest.raises(AssertionError):
        fake_flashmla.flash_mla_sparse_fwd(q, torch.zeros(4, 1, 528, dtype=torch.uint8), idx, 0.04)


DEEPGEMM_GENERATIONS = ["2.8", "2.8.0", "2.5", "legacy"]
_PAGED_DG = [make_case("paged_mqa_logits", B=3, next_n=n, context=200, H=64, block_size=64, lens_dim=d, clean=cl)
             for n in (1, 2) for d in (1, 2) for cl in (False, True)]
_SM100_LOGITS_REASON = "DeepGEMM API {} on sm100 needs MX (UE8M0, int32-packed) q and key scales, bf16 weights"


@pytest.mark.parametrize("generation", DEEPGEMM_GENERATIONS)
def test_deepgemm_contract(monkeypatch, generation):
    from fakes import deep_gemm as fake_deep_gemm
    fake_deep_gemm.install(monkeypatch, generation)
    with reprobed(monkeypatch, "deepgemm") as backend:
        assert backend.unavailable_reason() is None and f"installed: API {generation}" in backend.description
        ran, _ = _run_all("paged_mqa_logits", "deepgemm", "sm90")
        with dsv4ops.simulate_platform("cuda", "sm90"):
            results = [run_case(c, "deepgemm", "cpu", seed=5) for c in _PAGED_DG]
        assert all(r.status == "pass" for r in results), [r.message for r in results]
        ran, _ = _run_all("fp8_einsum", "deepgemm", "sm90")
        assert ran


@pytest.mark.parametrize("generation, served", [("2.8", True), ("2.8.0", True), ("2.5", False), ("legacy", False)])
def test_deepgemm_paged_32_heads(monkeypatch, generation, served):
    """The 2.8 line's paged kernel takes 32 or 64 heads (attention.hpp); earlier generations are served with
    64 only."""
    from fakes import deep_gemm as fake_deep_gemm
    fake_deep_gemm.install(monkeypatch, generation)
    case = make_case("paged_mqa_logits", B=3, next_n=2, context=200, H=32, block_size=64, lens_dim=1, clean=True)
    with reprobed(monkeypatch, "deepgemm"), dsv4ops.simulate_platform("cuda", "sm90"):
        result = run_case(case, "deepgemm", "cpu", seed=3)
    if served:
        assert result.status == "pass", result.message
    else:
        assert (result.status, result.message) == (
            "skip", f"H=32: DeepGEMM API {generation}'s paged kernel is built for 64 indexer heads"), result.message


@pytest.mark.parametrize("generation", DEEPGEMM_GENERATIONS)
def test_deepgemm_declines_sm100_with_the_reason(monkeypatch, generation):
    """The SM100 recipe (MX scales, bf16 weights and logits) is not adapted: declined, naming the API
    generation and what SM100 needs, before the vendor is called (the fakes assert SM90 inputs)."""
    from fakes import deep_gemm as fake_deep_gemm
    fake_deep_gemm.install(monkeypatch, generation)
    calls = {op: make_case(op, **kw).build("cpu", 0) for op, kw in (
        ("fp8_einsum", dict(B=2, H=2, D=128, R=512)), ("mqa_logits", dict(T=6, S=300, H=64)),
        ("paged_mqa_logits", dict(B=2, next_n=1, context=100, H=64, block_size=64)))}
    with reprobed(monkeypatch, "deepgemm"), dsv4ops.simulate_platform("cuda", "sm100"):
        status = {op: {c.backend: c.status for c in dsv4ops.explain(op, **kw).candidates}["deepgemm"]
                  for op, kw in calls.items()}
        with pytest.raises(dsv4ops.UnsupportedError, match="not adapted"):
            dsv4ops.mqa_logits(**calls["mqa_logits"], backend="deepgemm")
    assert status["fp8_einsum"] == (f"DeepGEMM API {generation} on sm100 keeps only the UE8M0 exponent of each fp32 "
                                    "scale; 128-wide block scales may be any fp32 (32-wide ones, powers of two, are served)")
    assert all(status[op].startswith(_SM100_LOGITS_REASON.format(generation)) for op in ("mqa_logits", "paged_mqa_logits"))


def test_deepgemm_api_generation_per_wheel():
    """fp8_fp4_mqa_logits' parameters as the wheels' _C.pyi declare them: 2.8.0 builds keep 2.5's
    clean_logits and add schedule_meta; 2.8.2 drops clean_logits."""
    from dsv4ops.backends.deepgemm import api_generation
    head = ("q", "kv", "weights", "cu_seq_len_k_start", "cu_seq_len_k_end")
    assert api_generation(head + ("clean_logits", "max_seqlen_k", "logits_dtype"), True) == "2.5"
    assert api_generation(head + ("clean_logits", "max_seqlen_k", "logits_dtype", "schedule_meta"), True) == "2.8.0"
    assert api_generation(head + ("max_seqlen_k", "schedule_meta"), False) == "2.8"
    assert api_generation(None, True) == "legacy"


_DG_EINSUM_32 = [make_case("fp8_einsum", **kw) for kw in (
    dict(B=5, H=2, D=96, R=160, block=32), dict(B=4, H=1, D=64, R=128, block=32, strided="a_scale:transposed"))]


@pytest.mark.parametrize("generation", ["2.8.0", "2.5"])
def test_deepgemm_sm100_einsum_follows_the_build(monkeypatch, generation):
    """A 2.8.0 build (2.5's logits parameters) serves SM100's 32-wide einsum blocks with recipe (1, 32, 32),
    as 2.8.2 does, and its logits are called with 2.5's arguments; a 2.5 build declines them on SM100."""
    from fakes import deep_gemm as fake_deep_gemm
    calls = []
    fake_deep_gemm.install(monkeypatch, generation, wrap=_recording(calls))
    with reprobed(monkeypatch, "deepgemm"):
        with dsv4ops.simulate_platform("cuda", "sm100"):
            kw = _DG_EINSUM_32[0].build("cpu", 0)
            status = {c.backend: c.status for c in dsv4ops.explain("fp8_einsum", **kw).candidates}["deepgemm"]
            results = [run_case(c, "deepgemm", "cpu", seed=5) for c in _DG_EINSUM_32]
        _simulated("cuda", "sm90", "mqa_logits", "deepgemm", _MQA_DG[:2])
        _simulated("cuda", "sm90", "paged_mqa_logits", "deepgemm", _PAGED_DG[:2])
    if generation == "2.5":
        assert status == "32-wide scale blocks on sm100 are adapted for DeepGEMM API 2.8 (installed: API 2.5)"
        assert [r.status for r in results] == ["skip"] * len(_DG_EINSUM_32)
    else:
        assert status == "selected" or status.startswith("available"), status
        assert [r.status for r in results] == ["pass"] * len(_DG_EINSUM_32), [r.message for r in results]
        assert {kwargs["recipe"] for path, _, kwargs in calls if path == "deep_gemm:fp8_einsum"} == {(1, 32, 32)}
    logits = {(path, len(args), tuple(kwargs)) for path, args, kwargs in calls if "logits" in path}
    assert logits == {("deep_gemm:get_paged_mqa_logits_metadata", 3, ()), ("deep_gemm:fp8_fp4_mqa_logits", 6, ()),
                      ("deep_gemm:fp8_fp4_paged_mqa_logits", 7, ())}, logits
    assert all(isinstance(args[5], bool) for path, args, _ in calls if path == "deep_gemm:fp8_fp4_mqa_logits")


_V41_DG = [make_case("paged_mqa_logits", B=2, next_n=1, context=100, H=32, block_size=64, layout="index_mxfp4",
                     q_fmt=q_fmt) for q_fmt in ("fp8", "mxfp4")] + \
          [make_case("mqa_logits", T=6, S=300, H=32, keys="mxfp4", q_fmt=q_fmt) for q_fmt in ("fp8", "mxfp4")]


@pytest.mark.parametrize("arch, reason", [
    ("sm90", "MXFP4 keys (V4.1): DeepGEMM reads MXFP4 with MX scales on SM100 only; on sm90 it takes fp8 q and 132 B"),
    ("sm100", _SM100_LOGITS_REASON.format("2.8"))])
def test_deepgemm_28_declines_mxfp4_with_the_reason(monkeypatch, arch, reason):
    """V4.1's MXFP4 keys (with fp8 or MXFP4 q): SM90 DeepGEMM has no MX-scale path; SM100's returns bf16
    logits from bf16 weights, past the op's fp32 bound (docs/ops.md §3): declined, nothing called."""
    from fakes import deep_gemm as fake_deep_gemm
    fake_deep_gemm.install(monkeypatch, "2.8", wrap=_refusing)
    with reprobed(monkeypatch, "deepgemm"), dsv4ops.simulate_platform("cuda", arch):
        for case in _V41_DG:
            kw = case.build("cpu", 0)
            status = {c.backend: c.status for c in dsv4ops.explain(case.op, **kw).candidates}["deepgemm"]
            assert status.startswith(reason), status


def _refusing(path, fn):
    """``fn``'s signature, raising when called."""
    @functools.wraps(fn)
    def refuse(*args, **kwargs):
        raise AssertionError(f"{path} must not be called")
    return refuse


def test_deepgemm_28_fake_holds_the_wheels_host_checks(monkeypatch):
    """The 2.8 fake asserts what 2.8.2's attention.hpp asserts: on SM100 packed FP4 q (int8 [B, 1, H, 64])
    with int32 MX scales, a 68 B cache, bf16 weights and varlen ``indices``; on SM90 fp8 and fp32 only."""
    from fakes import deep_gemm as fake
    B, H = 3, 32
    q4, sf = torch.zeros(B, 1, H, 64, dtype=torch.int8), torch.zeros(B, 1, H, dtype=torch.int32)
    cache = torch.zeros(5, 64, 1, 68, dtype=torch.uint8)
    lens, table = torch.ones(B, 1, dtype=torch.int32), torch.zeros(B, 2, dtype=torch.int32)
    indices, meta = torch.arange(B, dtype=torch.int32), torch.zeros(133, 2, dtype=torch.int32)
    with dsv4ops.simulate_platform("cuda", "sm100"):
        fake.get_paged_mqa_logits_metadata(lens, 64, 132, indices)
        fake._check_paged_28((q4, sf), cache, torch.zeros(B, H, dtype=torch.bfloat16), lens, table, meta, indices)
        for bad in (dict(weights=torch.zeros(B, H)), dict(indices=None), dict(cache=cache[..., :67]),
                    dict(sf=sf.view(torch.float32))):
            args = {"weights": torch.zeros(B, H, dtype=torch.bfloat16), "indices": indices, "cache": cache, "sf": sf, **bad}
            with pytest.raises(AssertionError):
                fake._check_paged_28((q4, args["sf"]), args["cache"], args["weights"], lens, table, meta,
                                     args["indices"])
    with dsv4ops.simulate_platform("cuda", "sm90"), pytest.raises(AssertionError):
        fake._check_paged_28((q4, None), cache, torch.zeros(B, H), lens, table, meta, None)


def test_deepgemm_unknown_api_is_unavailable(monkeypatch):
    """A deep_gemm whose fp8_fp4_mqa_logits declares neither generation's parameters is not called."""
    from fakes import deep_gemm as fake_deep_gemm
    fake_deep_gemm.install(monkeypatch, "2.8")

    def fp8_fp4_mqa_logits(q, kv, weights, cu_seq_len_k_start, cu_seq_len_k_end):
        raise AssertionError("must not be called")
    monkeypatch.setattr(sys.modules["deep_gemm"], "fp8_fp4_mqa_logits", fp8_fp4_mqa_logits)
    with reprobed(monkeypatch, "deepgemm") as backend:
        assert "deep_gemm declares an unknown fp8_fp4_mqa_logits" in backend.unavailable_reason()


_MQA_DG = [make_case("mqa_logits", T=T, S=S, H=64, ranges=r, clean=cl, out=cl)
           for T, S, r in ((6, 300, "causal"), (9, 513, "requests"), (5, 64, "random")) for cl in (False, True)] + \
          [make_case("mqa_logits", T=8, S=100, H=32, ranges="random", corner="empty", clean=True),
           make_case("mqa_logits", T=12, S=96, H=64, ranges="requests", topk=16)]


@pytest.mark.parametrize("generation", DEEPGEMM_GENERATIONS)
def test_deepgemm_mqa_logits_contract(monkeypatch, generation):
    """2.5 / legacy: the row-padded view is copied out, clean maps to clean_logits; 2.8: compressed rows
    (max_seqlen_k = S) moved to absolute columns and cleaned by the adapter. Other head counts and FNUZ
    inputs are declined with the reason."""
    from fakes import deep_gemm as fake_deep_gemm
    fake_deep_gemm.install(monkeypatch, generation)
    kw = _MQA_DG[2].build("cpu", 1)
    kw["k_scale"] = torch.cat([torch.zeros(1), kw["k_scale"]])[1:]                      # 4-byte aligned only
    kw["weights"] = torch.cat([kw["weights"], kw["weights"]], 1)[:, :64]              # row stride 128
    with reprobed(monkeypatch, "deepgemm"):
        ran, skipped = _simulated("cuda", "sm90", "mqa_logits", "deepgemm", _MQA_DG)
        with dsv4ops.simulate_platform("cuda", "sm90"):
            got = dsv4ops.mqa_logits(**kw, backend="deepgemm")                          # copied for TMA
    ref_kwargs = {**kw, "out": None}
    assert OPS["mqa_logits"].spec.conformance.compare({}, ref_kwargs, dsv4ops.reference.mqa_logits(**ref_kwargs), {}, got).ok
    assert {r.case.id for r in ran} >= {c.id for c in _MQA_DG}
    assert any("H=8: the SM90 kernel is built for 32 or 64 heads" == m for m in skipped.values())
    assert any("float8_e4m3fnuz inputs" in m for m in skipped.values())


def test_deepgemm_28_chunks_the_column_move(monkeypatch):
    """2.8's compressed rows reach absolute columns in row chunks (a bounded gather index): several chunks,
    requests at different key offsets, clean and not."""
    from dsv4ops.backends.deepgemm import ops as dg_ops
    from fakes import deep_gemm as fake_deep_gemm
    fake_deep_gemm.install(monkeypatch, "2.8")
    monkeypatch.setattr(dg_ops, "_GATHER_ELEMENTS", 3 * 300)                            # 3 rows per chunk
    cases_ = [make_case("mqa_logits", T=11, S=300, H=64, ranges="requests", clean=cl, out=cl) for cl in (False, True)]
    with reprobed(monkeypatch, "deepgemm"), dsv4ops.simulate_platform("cuda", "sm90"):
        results = [run_case(c, "deepgemm", "cpu", seed=7) for c in cases_]
    assert [r.status for r in results] == ["pass", "pass"], [r.message for r in results]


@pytest.fixture
def aiter(monkeypatch):
    from fakes import aiter as fake_aiter
    fake_aiter.install(monkeypatch)
    with reprobed(monkeypatch, "aiter") as backend:
        yield backend


def _simulated(vendor, arch, op, backend, extra=()):
    results = []
    with dsv4ops.simulate_platform(vendor, arch):
        for case in list(cases(op, "quick")) + list(extra):
            results.append(run_case(case, backend, "cpu", seed=13))
    bad = [f"{r.case.id}: {r.message}" for r in results if r.status in ("fail", "error")]
    assert not bad, bad
    return [r for r in results if r.status == "pass"], {r.case.id: r.message for r in results if r.status == "skip"}


_DECODE_SINGLE = [make_case("sparse_mla_decode", T=3, H=5, topk=64, layout=layout, need_lse=False, sink=sink,
                            corner=corner)
                  for layout in ("fp8_ds_mla", "bf16", "fp8_per_tensor")
                  for sink, corner in (("random", None), (None, "zero_len"), ("inf", None))]
_DECODE_TWO = [make_case("sparse_mla_decode", T=3, H=8, topk=32, layout=layout, extra_topk=64, extra_block_size=16,
                         need_lse=False, sink=sink, corner="zero_len")
               for layout in ("fp8_ds_mla", "bf16") for sink in (None, "inf")]


def test_aiter_decode_contract_gfx950(aiter):
    """pa_decode_sparse's gfx950 Gluon driver: 3-D fp8_ds_mla / bf16 caches with the extra segment,
    the 2-D OCP fp8 pool single-segment; lonely rows without a sink (NaN in the kernel) give 0."""
    ran, skipped = _simulated("rocm", "gfx950", "sparse_mla_decode", "aiter", _DECODE_SINGLE + _DECODE_TWO)
    assert {r.case.kwargs["layout"] for r in ran} == {"fp8_ds_mla", "bf16", "fp8_per_tensor"}
    assert any(r.case.kwargs.get("extra_topk") and r.case.kwargs.get("sink") is None for r in ran)
    assert any("need_lse=False" in m for m in skipped.values())
    assert any("ignores extra_cache" in m for m in skipped.values())


def test_aiter_decode_contract_gfx942(aiter):
    """The Triton path: flat bf16 pool, a sink tensor always (-1e30 for none, +-inf clamped)."""
    ran, skipped = _simulated("rocm", "gfx942", "sparse_mla_decode", "aiter", _DECODE_SINGLE)
    assert {r.case.kwargs["layout"] for r in ran} == {"bf16"}
    assert {r.case.kwargs.get("sink") for r in ran} == {"random", None, "inf"}
    assert any("gfx950-only" in m for m in skipped.values())


_PREFILL = [make_case("sparse_mla_prefill", T=3, H=H, topk=32, layout=layout, extra_topk=64, extra_block_size=16,
                       need_lse=False, sink=sink, corner=corner)
            for layout in ("fp8_ds_mla", "bf16")
            for H, sink, corner in ((16, "random", None), (64, None, "zero_len"), (20, "inf", "all_invalid"))]


def test_aiter_prefill_contract_gfx950(aiter):
    """pa_prefill_sparse (mla_gluon) over the gathered bf16 pool: both segments in one CSR stream,
    heads padded to 64 / 128, lonely rows zeroed; calls that want the lse are declined."""
    ran, skipped = _simulated("rocm", "gfx950", "sparse_mla_prefill", "aiter", _PREFILL)
    assert {r.case.kwargs["layout"] for r in ran} == {"fp8_ds_mla", "bf16"}
    assert {r.case.kwargs["H"] for r in ran} >= {16, 20, 64}
    assert any("need_lse=False" in m for m in skipped.values())
    with dsv4ops.simulate_platform("rocm", "gfx942"):
        d = dsv4ops.explain("sparse_mla_prefill", **_PREFILL[0].build("cpu", 0))
    assert {c.backend: c.status for c in d.candidates}["aiter"] == "arch gfx942 not supported (needs gfx950)"


def test_aiter_topk_contract(aiter):
    """AITER returns absolute columns; the adapter makes them row-local, so ranges are served too."""
    ran, skipped = _simulated("rocm", "gfx942", "indexer_topk", "aiter")
    assert {r.case.kwargs.get("mode", "ranges") for r in ran} == {"ranges", "decode1d", "decode2d"}
    assert not skipped and any(r.case.kwargs.get("column_major") for r in ran)


_MQA_AITER = [make_case("mqa_logits", T=T, S=S, H=H, ranges=r, clean=cl, flavour=f)
              for T, S, H, r in ((6, 300, 64, "causal"), (9, 70, 16, "random")) for cl in (False, True)
              for f in ("ocp", "fnuz")] + [make_case("mqa_logits", T=12, S=96, H=32, ranges="requests", topk=16)]


@pytest.mark.parametrize("arch", ["gfx942", "gfx950"])
def test_aiter_mqa_logits_contract(aiter, arch):
    """fp8_mqa_logits on both arches (gfx942 recasts OCP to FNUZ, FNUZ inputs read natively; gfx950 OCP
    only); the 256-aligned view is copied out; head counts the kernel cannot tile are declined."""
    ran, skipped = _simulated("rocm", arch, "mqa_logits", "aiter", _MQA_AITER)
    flavours = {r.case.kwargs.get("flavour", "ocp") for r in ran}
    assert flavours == ({"ocp", "fnuz"} if arch == "gfx942" else {"ocp"})
    assert {r.case.kwargs.get("clean", False) for r in ran} == {False, True} and any("topk" in r.case.kwargs for r in ran)
    assert any("needs a power-of-two head count of at least 16" in m for m in skipped.values())


@pytest.mark.parametrize("version, op, arch, expected", [
    ("0.1.17", "sparse_mla_decode", "gfx950",
     "AITER 0.1.17 has no pa_decode_sparse(extra_cache=...): install AITER >= 0.1.20"),
    ("0.1.17", "sparse_mla_decode", "gfx942", None),
    ("0.1.12", "indexer_topk", "gfx942", "AITER 0.1.12 has no top_k_per_row_decode(k=...): install AITER >= 0.1.15"),
    ("0.1.19", "sparse_mla_prefill", "gfx950", "AITER 0.1.19 has no pa_prefill_sparse: install AITER >= 0.1.20"),
    ("0.1.12", "mqa_logits", "gfx950", "AITER 0.1.12 has no fp8_mqa_logits(clean_logits=...): install AITER >= 0.1.15"),
])
def test_aiter_version_floors(monkeypatch, version, op, arch, expected):
    from fakes import aiter as fake_aiter
    fake_aiter.install(monkeypatch, version=version)
    kw = (dict(T=2, H=8, topk=32, layout="bf16", need_lse=False) if op.startswith("sparse_mla")
          else dict(T=4, S=64, H=16) if op == "mqa_logits" else dict(R=4, W=128, k=16, mode="decode1d"))
    with reprobed(monkeypatch, "aiter"), dsv4ops.simulate_platform("rocm", arch):
        d = dsv4ops.explain(op, **make_case(op, **kw).build("cpu", 0))
    status = {c.backend: c.status for c in d.candidates}["aiter"]
    if expected:
        assert status == expected
    else:
        assert "AITER" not in status and "install" not in status, status


def test_aiter_without_pa_decode_sparse(monkeypatch):
    """An AITER without the module (<= 0.1.14, or the PyPI 0.1.7 build) names the function and floor."""
    from fakes import aiter as fake_aiter
    fake_aiter.install(monkeypatch, version="0.1.7.post2.dev18")
    monkeypatch.delitem(sys.modules, "aiter.ops.triton.attention.pa_decode_sparse")
    monkeypatch.setattr(sys.modules["aiter.ops.triton.attention"], "__path__", [], raising=False)
    from dsv4ops.backends.aiter import _feature
    reason = _feature("aiter.ops.triton.attention.pa_decode_sparse", "pa_decode_sparse", "extra_cache", "0.1.20",
                      "0.1.7.post2.dev18")
    assert reason == "AITER 0.1.7.post2.dev18 has no pa_decode_sparse: install AITER >= 0.1.20", reason


# ------------------------------------------------------------------------------------------------
# XPU (vllm-xpu-kernels), fakes registered as torch ops with the released schemas

@pytest.fixture
def xpu(monkeypatch, request):
    from fakes import xpu as fake_xpu
    fake_xpu.install(monkeypatch, request)
    with reprobed(monkeypatch, "xpu") as backend:
        yield backend


def test_xpu_qnorm_contract(xpu):
    ran, skipped = _simulated("xpu", "bmg", "qnorm_rope_kv_insert", "xpu")
    assert {r.case.kwargs["layout"] for r in ran} == {"bf16"}
    assert any(r.case.kwargs.get("dp_pad") for r in ran) and any(r.case.kwargs.get("out") for r in ran)
    assert any("subnormals" in m for m in skipped.values())


def test_xpu_fp8_ds_mla_writer_differs_on_subnormals():
    """Why fp8_ds_mla is declined: the SYCL writer's integer e4m3 conversion (modelled in the fake)
    flushes |x / scale| < 2^-7 to 0 and mis-encodes [2^-7, 2^-6), where docs/ops.md §6.1 rounds to
    the e4m3 subnormals; bytes of normal values agree."""
    from fakes.xpu import _fp8_bytes
    x = torch.tensor([448.0, 1.0, 2.0 ** -6, 2.0 ** -7, 2.0 ** -8, 0.0, -3.0])
    ours = x.to(torch.float8_e4m3fn).view(torch.uint8)
    theirs = _fp8_bytes(x, torch.tensor(127))
    assert torch.equal(theirs[[0, 1, 2, 5, 6]], ours[[0, 1, 2, 5, 6]])
    assert not torch.equal(theirs[3:5], ours[3:5])


_LOGITS64 = [make_case("paged_mqa_logits", B=3, next_n=n, context=150, H=8, block_size=64, lens_dim=d, clean=cl,
                       out=n == 2)
             for n in (1, 2) for d in (1, 2) for cl in (False, True)] + \
            [make_case("paged_mqa_logits", B=3, next_n=2, context=100, H=8, block_size=64, corner=c, clean=True)
             for c in ("zero_len", "short", "padded_rows")]


def test_xpu_paged_logits_contract(xpu):
    ran, skipped = _simulated("xpu", "bmg", "paged_mqa_logits", "xpu", _LOGITS64)
    assert len(ran) == len(_LOGITS64)
    assert all("block_size 16 != 64" in m or m.startswith("MXFP4 keys (V4.1): fp8_paged_mqa_logits reads")
               for m in skipped.values()), skipped
    kw = _LOGITS64[0].build("cpu", 0)
    with dsv4ops.simulate_platform("xpu", "xpu"):             # not an Xe2 device
        status = {c.backend: c.status for c in dsv4ops.explain("paged_mqa_logits", **kw).candidates}
    assert "Xe2 only" in status["xpu"]


def test_xpu_topk_contract(xpu):
    ran, skipped = _simulated("xpu", "bmg", "indexer_topk", "xpu")
    assert not skipped and len(ran) == len(cases("indexer_topk", "quick"))


def test_xpu_probe_names_package(monkeypatch, request):
    monkeypatch.setitem(sys.modules, "vllm_xpu_kernels", None)
    with reprobed(monkeypatch, "xpu") as backend:
        assert "vllm-xpu-kernels" in backend.unavailable_reason()
        assert backend.unavailable_reason().startswith("cannot import vllm_xpu_kernels._xpu_C")
    from fakes import xpu as fake_xpu
    fake_xpu.install(monkeypatch, request, missing=("deepseek_qnorm_rope_kv_insert",))
    kw = make_case("qnorm_rope_kv_insert", T=2, H=4, layout="bf16").build("cpu", 0)
    with reprobed(monkeypatch, "xpu") as backend, dsv4ops.simulate_platform("xpu", "bmg"):
        assert backend.unavailable_reason() is None
        status = {c.backend: c.status for c in dsv4ops.explain("qnorm_rope_kv_insert", **kw).candidates}
    assert status["xpu"] == ("vllm-xpu-kernels lacks torch.ops._xpu_C.deepseek_qnorm_rope_kv_insert: "
                             "install vllm-xpu-kernels >= 0.1.11")


def test_explain_on_simulated_rocm_and_xpu():
    """What a gfx942 or XPU box would run, and why (the vendor libraries are absent here)."""
    kw = make_case("indexer_topk", **dict(R=4, W=128, k=16, mode="decode2d")).build("cpu", 0)
    with dsv4ops.simulate_platform("rocm", "gfx942"):
        status = {c.backend: c.status for c in dsv4ops.explain("indexer_topk", **kw).candidates}
    assert status["aiter"].startswith("cannot import aiter") and "platform rocm" in status["flashinfer"]
    with dsv4ops.simulate_platform("xpu", "xpu"):
        d = dsv4ops.explain("indexer_topk", **kw)
    status = {c.backend: c.status for c in d.candidates}
    assert "platform xpu not supported" in status["aiter"] and "platform xpu" in status["flashinfer"]


# ------------------------------------------------------------------------------------------------
# API-drift alarm: the adapters' vendor calls against the vendors' signatures

def _recording(calls):
    def wrap(path, fn):
        @functools.wraps(fn)
        def recorded(*args, **kwargs):
            calls.append((path, args, kwargs))
            return fn(*args, **kwargs)
        return recorded
    return wrap


def _record_aiter(monkeypatch):
    from fakes import aiter as fake_aiter
    calls = []
    fake_aiter.install(monkeypatch, wrap=_recording(calls))
    with reprobed(monkeypatch, "aiter"):
        _simulated("rocm", "gfx950", "sparse_mla_decode", "aiter", _DECODE_SINGLE + _DECODE_TWO)
        _simulated("rocm", "gfx942", "sparse_mla_decode", "aiter", _DECODE_SINGLE)
        _simulated("rocm", "gfx942", "indexer_topk", "aiter")
        _simulated("rocm", "gfx942", "mqa_logits", "aiter", _MQA_AITER)
        _simulated("rocm", "gfx950", "sparse_mla_prefill", "aiter", _PREFILL)
    return fake_aiter.CALLED, calls


def _record_flashinfer(monkeypatch):
    from fakes import flashinfer as fake_fi
    calls = []
    fake_fi.install(monkeypatch, wrap=_recording(calls))
    with reprobed(monkeypatch, "flashinfer"):
        _run_all("sparse_mla_decode", "flashinfer", "sm100")
        _run_all("sparse_mla_decode", "flashinfer", "sm120")
        _run_all("indexer_topk", "flashinfer", "sm90")
    return fake_fi.CALLED, calls


def _record_flashmla(monkeypatch):
    from fakes import flashmla as fake_flashmla
    calls = []
    fake_flashmla.install(monkeypatch, wrap=_recording(calls))
    with reprobed(monkeypatch, "flashmla"):
        _run_all("sparse_mla_prefill", "flashmla", "sm90")
        _run_all("sparse_mla_prefill", "flashmla", "sm100")
        with dsv4ops.simulate_platform("cuda", "sm90"):     # decode: the calls only (the fake returns zeros)
            for extra in ({}, dict(extra_topk=64, extra_block_size=64)):
                kw = make_case("sparse_mla_decode", T=2, H=8, topk=64, layout="fp8_ds_mla", sink="random",
                               **extra).build("cpu", 0)
                dsv4ops.sparse_mla_decode(**kw, backend="flashmla")
    return fake_flashmla.CALLED, calls


def _record_flashmla_v41(monkeypatch):
    """The V4.1 decode calls (split pages, each extra layout; SM100), against the 0924 fake."""
    from fakes import flashmla as fake_flashmla

    from dsv4ops.backends.flashmla.decode import sparse_mla_decode
    calls = []
    fake_flashmla.install(monkeypatch, wrap=_recording(calls), v41=True)
    with reprobed(monkeypatch, "flashmla"), dsv4ops.simulate_platform("cuda", "sm100"):
        for extra in ("nvfp4_v41", "mxfp8_v41", None):
            sparse_mla_decode(v41_decode_args(extra_layout=extra))
    return {p: f for p, f in fake_flashmla.CALLED.items() if p != "flash_mla:flash_mla_sparse_fwd"}, calls


def _record_deepgemm(monkeypatch, generation):
    from fakes import deep_gemm as fake_deep_gemm
    calls = []
    fake_deep_gemm.install(monkeypatch, generation, wrap=_recording(calls))
    with reprobed(monkeypatch, "deepgemm"):   # not the topk case: it also runs whichever top-k dispatch picks
        _simulated("cuda", "sm90", "mqa_logits", "deepgemm", [c for c in _MQA_DG if "topk" not in c.kwargs])
        _simulated("cuda", "sm90", "paged_mqa_logits", "deepgemm", _PAGED_DG)
        _simulated("cuda", "sm90", "fp8_einsum", "deepgemm")
    return fake_deep_gemm.called(generation), calls


RECORDERS = {"aiter": _record_aiter, "flashinfer": _record_flashinfer, "flashmla": _record_flashmla,
             "flashmla-v41": _record_flashmla_v41,
             **{f"deepgemm-{g}": functools.partial(_record_deepgemm, generation=g) for g in DEEPGEMM_GENERATIONS}}


def source_signature(fn: ast.FunctionDef) -> inspect.Signature:
    """The parameter list of a function definition read from source or a stub (names, kinds, presence of
    defaults), for releases that cannot be imported here."""
    P, a = inspect.Parameter, fn.args
    positional = [(x, P.POSITIONAL_ONLY) for x in a.posonlyargs] + [(x, P.POSITIONAL_OR_KEYWORD) for x in a.args]
    first_default = len(positional) - len(a.defaults)
    params = [P(x.arg, kind, default=None if i >= first_default else P.empty)
              for i, (x, kind) in enumerate(positional)]
    params += [P(a.vararg.arg, P.VAR_POSITIONAL)] if a.vararg else []
    params += [P(x.arg, P.KEYWORD_ONLY, default=P.empty if d is None else None)
               for x, d in zip(a.kwonlyargs, a.kw_defaults)]
    params += [P(a.kwarg.arg, P.VAR_KEYWORD)] if a.kwarg else []
    return inspect.Signature(params)


def _bind_all(calls, signature_of):
    called = set()
    for path, args, kwargs in calls:
        signature_of(path).bind(*args, **kwargs)        # TypeError names the missing / unknown argument
        called.add(path)
    return called


@pytest.mark.parametrize("vendor", sorted(RECORDERS))
def test_adapter_calls_bind_to_fake_signatures(monkeypatch, vendor):
    """Runs in CI: every vendor call the adapters make binds to the fakes' parameter lists, which are
    copied from the released signatures (and compared with the installed ones below)."""
    functions, calls = RECORDERS[vendor](monkeypatch)
    called = _bind_all(calls, lambda path: inspect.signature(functions[path]))
    assert called == set(functions), set(functions) - called


def _real_function(path):
    module, _, name = path.partition(":")
    return getattr(importlib.import_module(module), name)


# An installed release that does not import is a failure (the break the drift check exists to report),
# except where this torch lacks the accelerator runtime the release is built for and the import error
# names that runtime: then its parameter lists are read from its installed sources.
ACCELERATOR_RUNTIME = {
    "cuda": (lambda: torch.version.cuda is None, r"cuda|libcu|nvidia|nvrtc"),
    "rocm": (lambda: torch.version.hip is None, r"hip|rocm|amdgpu"),
    "xpu": (lambda: not (hasattr(torch, "xpu") and torch.xpu.is_available()), r"xpu|sycl|ze_loader|level.zero"),
}


def import_release(module: str, dist: str, accelerator: str):
    """``module`` of the installed ``dist``, imported; None where it cannot import here for the known
    reason (this torch has no ``accelerator`` runtime and the error names it). Skips where ``dist`` is
    not installed; fails, with the error, where the import fails for any other reason."""
    try:
        version = importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        pytest.skip(f"{dist} is not installed here; the drift check runs where it installs (CI's drift step)")
    try:
        return importlib.import_module(module)
    except Exception as exc:
        error = f"{type(exc).__name__}: {exc}"
        lacks_runtime, names_runtime = ACCELERATOR_RUNTIME[accelerator]
        if lacks_runtime() and re.search(names_runtime, error, re.IGNORECASE):
            return None
        pytest.fail(f"{dist} {version} is installed but `import {module}` fails: {error}")


def source_function_signature(dist: str, path: str) -> inspect.Signature:
    """The parameter list of ``module:function`` from the installed sources of ``dist`` (nothing
    imported), following re-exports (``from .x import function``, ``from .x import *``)."""
    files = importlib.metadata.distribution(dist)

    def find(module: str, name: str, depth: int) -> inspect.Signature | None:
        parts = module.split(".")
        candidates = (Path(*parts).with_suffix(".py"), Path(*parts).with_suffix(".pyi"), Path(*parts, "__init__.py"))
        file = next((f for f in candidates if Path(files.locate_file(f)).exists()), None)
        if file is None or depth > 8:
            return None
        tree = ast.parse(Path(files.locate_file(file)).read_text())
        defs = {node.name: node for node in tree.body if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))}
        if name in defs:
            return source_signature(defs[name])
        package = parts if file.name == "__init__.py" else parts[:-1]
        imports = [node for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)]
        named = [(node, alias.name) for node in imports for alias in node.names if (alias.asname or alias.name) == name]
        starred = [(node, name) for node in imports if any(alias.name == "*" for alias in node.names)]
        for node, source_name in named + starred:
            base = package[: len(package) - node.level + 1] if node.level else []
            found = find(".".join(base + (node.module.split(".") if node.module else [])), source_name, depth + 1)
            if found is not None:
                return found
        return None

    module, _, name = path.partition(":")
    found = find(module, name, 0)
    if found is None:
        raise LookupError(f"{dist}: no definition of {path} in its installed sources")
    return found


@pytest.mark.parametrize("vendor, module, dist, accelerator", [("aiter", "aiter", "amd-aiter", "rocm"),
                                                              ("flashinfer", "flashinfer", "flashinfer-python", "cuda"),
                                                              ("flashmla", "flash_mla", "tokenspeed-flashmla", "cuda"),
                                                              ("deepgemm", "deep_gemm", "tokenspeed-deepgemm", "cuda")])
def test_adapter_calls_bind_to_installed_signatures(monkeypatch, vendor, module, dist, accelerator):
    """Where the vendor package is installed: the same recorded calls bind to the real functions (read
    from its sources where it cannot import for want of its accelerator runtime), and the fakes'
    parameter lists equal the real ones (so the CI run above stays meaningful)."""
    imported = import_release(module, dist, accelerator)
    if vendor == "deepgemm":
        if imported is None:
            pytest.skip(f"{dist} needs a CUDA torch to import; its declarations (deep_gemm/_C.pyi) are checked from "
                        "the wheel by tests/test_vendor_wheels.py")
        from dsv4ops.backends.deepgemm import api
        vendor = f"deepgemm-{api()}"
    with monkeypatch.context() as m:
        fakes, calls = RECORDERS[vendor](m)
    real = {}
    for path in fakes:
        try:
            real[path] = (declared_signature(_real_function(path)) if imported is not None
                          else source_function_signature(dist, path))
        except Exception as exc:
            pytest.fail(f"{dist}: the adapter calls {path}, which the installed release lacks ({exc})")
    _bind_all(calls, real.__getitem__)
    for path, sig in real.items():
        ours = [(p.name, p.kind) for p in inspect.signature(fakes[path]).parameters.values()]
        theirs = [(p.name, p.kind) for p in sig.parameters.values()]
        assert ours == theirs, f"{path}: the fake's parameters differ from {dist}'s"


def test_a_release_that_does_not_import_fails_unless_it_lacks_its_runtime(monkeypatch):
    """The drift check's import rule: not installed skips; installed but failing to import for want of
    the accelerator runtime (CPU torch, error naming CUDA) reads sources; any other import error fails."""
    monkeypatch.setattr(importlib.metadata, "version", lambda dist: "9.9")
    monkeypatch.setattr(torch.version, "cuda", None)

    def failing(error):
        def import_module(name):
            raise error
        monkeypatch.setattr(importlib, "import_module", import_module)

    failing(OSError("libcudart.so.13: cannot open shared object file"))
    assert import_release("vendor_pkg", "vendor-pkg", "cuda") is None
    failing(ImportError("cannot import name 'top_k_ragged_transform' from 'vendor_pkg.topk'"))
    with pytest.raises(pytest.fail.Exception, match=r"vendor-pkg 9.9 is installed but `import vendor_pkg` fails: "
                                                      r"ImportError: cannot import name 'top_k_ragged_transform'"):
        import_release("vendor_pkg", "vendor-pkg", "cuda")
    monkeypatch.setattr(torch.version, "cuda", "12.8")           # a CUDA torch: no excuse
    failing(OSError("libcudart.so.13: cannot open shared object file"))
    with pytest.raises(pytest.fail.Exception, match="libcudart"):
        import_release("vendor_pkg", "vendor-pkg", "cuda")


def test_source_signatures_follow_re_exports(monkeypatch, tmp_path):
    """A function re-exported by the package (aliased, through a ``from .impl import *``) is read where
    it is defined."""
    package = tmp_path / "vendor_pkg"
    (package / "ops").mkdir(parents=True)
    (package / "__init__.py").write_text("from .ops import kernel as fast_kernel\n")
    (package / "ops" / "__init__.py").write_text("from .impl import *\n")
    (package / "ops" / "impl.py").write_text("def kernel(q, k, /, scale=1.0, *, out=None, **extra):\n    pass\n")

    class Files:
        locate_file = staticmethod(lambda f: tmp_path / f)

    monkeypatch.setattr(importlib.metadata, "distribution", lambda dist: Files)
    sig = source_function_signature("vendor-pkg", "vendor_pkg:fast_kernel")
    assert [(p.name, p.kind, p.default is p.empty) for p in sig.parameters.values()] == [
        ("q", inspect.Parameter.POSITIONAL_ONLY, True), ("k", inspect.Parameter.POSITIONAL_ONLY, True),
        ("scale", inspect.Parameter.POSITIONAL_OR_KEYWORD, False), ("out", inspect.Parameter.KEYWORD_ONLY, False),
        ("extra", inspect.Parameter.VAR_KEYWORD, True)]
    with pytest.raises(LookupError, match="no definition of vendor_pkg:missing"):
        source_function_signature("vendor-pkg", "vendor_pkg:missing")


def _schema_args(schema_str):
    sig = torch._C.parse_schema(schema_str)
    return [(a.name, str(a.type), a.alias_info is not None and a.alias_info.is_write) for a in sig.arguments]


def test_xpu_schemas_match_installed():
    """Where vllm-xpu-kernels imports (a PyTorch XPU build): its op schemas equal the fakes', which the
    dispatcher enforces on every adapter call in the contract tests above."""
    from fakes import xpu as fake_xpu
    if any(import_release(m, "vllm-xpu-kernels", "xpu") is None for m in ("vllm_xpu_kernels._xpu_C",
                                                                       "vllm_xpu_kernels._C")):
        pytest.skip("vllm-xpu-kernels needs an XPU torch to import, and its schemas are compiled in (no "
                    "source to read them from): the drift check runs on an XPU machine")
    for path in fake_xpu.CALLED:
        namespace, _, name = path.partition("::")
        real = str(getattr(getattr(torch.ops, namespace), name).default._schema)
        assert _schema_args(real) == _schema_args(fake_xpu.SCHEMAS[namespace][name]), (path, real)


def test_xpu_fake_schemas_parse():
    """The copied schema strings are well-formed and name the arguments the adapters pass."""
    from fakes import xpu as fake_xpu
    names = {path: [a[0] for a in _schema_args(fake_xpu.SCHEMAS[path.split("::")[0]][path.split("::")[1]])]
             for path in fake_xpu.CALLED}
    assert names["_xpu_C::deepseek_qnorm_rope_kv_insert"][-1] == "kv_cache_dtype"
    assert names["_C::top_k_per_row_prefill"][-1] == "topK"
