"""Contract tests for vendor paths that cannot run on this machine: the adapter's own code runs end
to end against a fake of the vendor entry point (tests/fakes), judged by the conformance rules on
a simulated platform; and the capability checks decline where the vendor kernel cannot run."""
import pytest

import dsv4ops
from dsv4ops import registry
from dsv4ops.conformance import cases, run_case
from dsv4ops.conformance.cases import make_case

from fakes import flashinfer as fake_flashinfer


@pytest.fixture
def flashinfer(monkeypatch):
    fake_flashinfer.install(monkeypatch)
    backend = registry.get_backend("flashinfer")
    monkeypatch.setattr(backend, "_probed", None)       # re-probe against the fake
    yield backend
    backend._probed = None


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
    assert any("layout 'fp8_ds_mla'" in m for m in skipped.values())
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
        assert "runs on sm100" in {c.backend: c.status for c in d.candidates}["flashinfer"]
        with pytest.raises(dsv4ops.UnsupportedError, match="flashinfer: arch sm90"):
            dsv4ops.sparse_mla_decode(**kw, backend="flashinfer")


def test_flashmla_sm100_topk_tiles():
    """On SM100 FlashMLA walks h128 index lists in tiles of 128: a 64-wide list is declined there."""
    from dsv4ops.backends.flashmla import topk_multiple
    kw = make_case("sparse_mla_decode", **dict(T=1, H=128, topk=64, layout="fp8_ds_mla")).build("cpu", 0)
    call = dsv4ops.OPS["sparse_mla_decode"].validate(**kw)
    with dsv4ops.simulate_platform("cuda", "sm100"):
        assert "multiple of 128" in topk_multiple(dsv4ops.platform(), call)
    with dsv4ops.simulate_platform("cuda", "sm90"):
        assert topk_multiple(dsv4ops.platform(), call) is None


@pytest.mark.parametrize("generation", ["new", "old"])
def test_deepgemm_contract(monkeypatch, generation):
    from fakes import deep_gemm as fake_deep_gemm
    fake_deep_gemm.install(monkeypatch, generation)
    backend = registry.get_backend("deepgemm")
    monkeypatch.setattr(backend, "_probed", None)
    try:
        ran, _ = _run_all("paged_mqa_logits", "deepgemm", "sm90")
        full = [make_case("paged_mqa_logits", B=3, next_n=n, context=200, H=64, block_size=64, lens_dim=d, clean=cl)
                for n in (1, 2) for d in (1, 2) for cl in (False, True)]
        with dsv4ops.simulate_platform("cuda", "sm90"):
            results = [run_case(c, "deepgemm", "cpu", seed=5) for c in full]
        assert all(r.status == "pass" for r in results), [r.message for r in results]
        ran, _ = _run_all("fp8_einsum", "deepgemm", "sm90")
        assert ran
    finally:
        backend._probed = None


def test_deepgemm_declines_sm100_until_adapted(monkeypatch):
    from fakes import deep_gemm as fake_deep_gemm
    fake_deep_gemm.install(monkeypatch)
    backend = registry.get_backend("deepgemm")
    monkeypatch.setattr(backend, "_probed", None)
    kw = make_case("fp8_einsum", **dict(B=2, H=2, D=128, R=512)).build("cpu", 0)
    try:
        with dsv4ops.simulate_platform("cuda", "sm100"):
            status = {c.backend: c.status for c in dsv4ops.explain("fp8_einsum", **kw).candidates}
        assert "arch sm100 not supported (needs sm90)" == status["deepgemm"]
    finally:
        backend._probed = None


@pytest.fixture
def aiter(monkeypatch):
    from fakes import aiter as fake_aiter
    fake_aiter.install(monkeypatch)
    backend = registry.get_backend("aiter")
    monkeypatch.setattr(backend, "_probed", None)
    yield backend
    backend._probed = None


def _simulated(vendor, arch, op, backend):
    results = []
    with dsv4ops.simulate_platform(vendor, arch):
        for case in cases(op, "quick"):
            results.append(run_case(case, backend, "cpu", seed=13))
    bad = [f"{r.case.id}: {r.message}" for r in results if r.status in ("fail", "error")]
    assert not bad, bad
    return [r for r in results if r.status == "pass"], {r.case.id: r.message for r in results if r.status == "skip"}


def test_aiter_decode_contract_gfx950(aiter):
    ran, skipped = _simulated("rocm", "gfx950", "sparse_mla_decode", "aiter")
    assert {r.case.kwargs["layout"] for r in ran} == {"fp8_ds_mla", "bf16", "fp8_per_tensor"}
    assert any("need_lse=False" in m for m in skipped.values())


def test_aiter_decode_contract_gfx942(aiter):
    ran, skipped = _simulated("rocm", "gfx942", "sparse_mla_decode", "aiter")
    assert [r.case.kwargs["layout"] for r in ran] == ["bf16"]
    assert any("gfx950-only" in m for m in skipped.values())


def test_aiter_topk_contract(aiter):
    ran, skipped = _simulated("rocm", "gfx942", "indexer_topk", "aiter")
    assert {r.case.kwargs.get("mode") for r in ran} == {"decode1d", "decode2d"}
    assert all("unconfirmed" in m for m in skipped.values())


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
