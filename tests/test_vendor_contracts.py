"""Contract tests for vendor paths that cannot run on this machine: the adapter's own code runs end
to end against a fake of the vendor entry point (tests/fakes), judged by the conformance rules on
a simulated platform; and the capability checks decline where the vendor kernel cannot run."""
import pytest
import torch

import dsv4ops
from dsv4ops import registry
from dsv4ops.conformance import cases, run_case
from dsv4ops.conformance.cases import Case

from .fakes import flashinfer as fake_flashinfer


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
    narrow = Case("sparse_mla_decode", tuple(sorted(dict(T=2, H=8, topk=64, layout="bf16", need_lse=False).items())))
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
    kw = Case("sparse_mla_decode", tuple(sorted(dict(T=2, H=8, topk=128, layout="bf16", need_lse=False).items()))
              ).build("cpu", 0)
    with dsv4ops.simulate_platform("cuda", "sm90"):
        d = dsv4ops.explain("sparse_mla_decode", **kw, backend="flashinfer")
        assert d.selected is None
        assert "runs on sm100" in {c.backend: c.status for c in d.candidates}["flashinfer"]
        with pytest.raises(dsv4ops.UnsupportedError, match="flashinfer: arch sm90"):
            dsv4ops.sparse_mla_decode(**kw, backend="flashinfer")


def test_flashmla_sm100_topk_tiles():
    """On SM100 FlashMLA walks h128 index lists in tiles of 128: a 64-wide list is declined there."""
    from dsv4ops.backends.flashmla import topk_multiple
    kw = Case("sparse_mla_decode", tuple(sorted(dict(T=1, H=128, topk=64, layout="fp8_ds_mla").items()))).build("cpu", 0)
    call = dsv4ops.OPS["sparse_mla_decode"].validate(**kw)
    with dsv4ops.simulate_platform("cuda", "sm100"):
        assert "multiple of 128" in topk_multiple(dsv4ops.platform(), call)
    with dsv4ops.simulate_platform("cuda", "sm90"):
        assert topk_multiple(dsv4ops.platform(), call) is None
