"""docs/verified.md: generated from docs/conformance/, each row with the kernel version it verified.

The committed page is what the report generates (byte for byte); docs/conformance/versions.json is
what git history gives for the artifacts that record no sources (checked only where that history is
here); a row is current, stale (naming the changed files) or unknown; the reference compared with
itself is counted apart; ``dsv4ops check --json`` records the commit, the forcing settings and the
source hashes.
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from dsv4ops import cli
from dsv4ops.conformance import cases, report, versions

ROOT = Path(__file__).resolve().parents[1]
CONFORMANCE = ROOT / "docs" / "conformance"
REGENERATE = "python -m dsv4ops.conformance.report docs/conformance"


def test_verified_md_is_what_the_report_generates():
    committed = (ROOT / "docs" / "verified.md").read_text(encoding="utf-8")
    assert report.verified_table(CONFORMANCE) == committed, (
        f"docs/verified.md differs from its artifacts and today's sources (a kernel changed?): run `{REGENERATE}`")


def test_versions_json_is_what_git_history_gives():
    recorded = versions.load_versions(CONFORMANCE)
    commits = {entry["commit"] for entry in recorded.values()}
    missing = sorted(c for c in commits if not versions.has_history(c))
    if missing:
        pytest.skip(f"git history without the artifacts' commits {missing} (a shallow clone, or no git)")
    assert versions.derived_versions(CONFORMANCE, recorded) == recorded, (
        "docs/conformance/versions.json is out of date: run `python -m dsv4ops.conformance.versions docs/conformance`, "
        f"then `{REGENERATE}`")


def test_every_artifact_has_a_version():
    recorded = versions.load_versions(CONFORMANCE)
    for path in versions.artifacts(CONFORMANCE):
        meta = json.loads(path.read_text())["meta"]
        assert "sources" in meta or path.name in recorded, f"{path.name}: no sources recorded and not in versions.json"


def test_an_implementation_is_its_module_and_the_backend_modules_it_imports():
    files = versions.implementation_files("triton", "paged_mqa_topk")
    assert {"backends/triton/paged_mqa_topk.py", "backends/triton/kth.py",
            "backends/triton/indexer_topk.py"} <= set(files)
    assert all((ROOT / f).is_file() for f in files)
    assert versions.implementation_files("reference", "paged_mqa_topk") == ()


def _artifact(folder: Path, name: str, rows: list[dict], **meta) -> None:
    meta = dict(date="2026-12-01T00:00:00+00:00", device="NVIDIA H100 80GB HBM3", tier="full", **meta)
    (folder / name).write_text(json.dumps(dict(meta=meta, results=rows)))


def _rows(backend: str, op: str, n: int) -> list[dict]:
    return [dict(op=op, case=f"{op}[{i}]", backend=backend, status="pass", worst=0.5, message="") for i in range(n)]


def _rows_section(text: str) -> str:
    return text.split("## Rows", 1)[1].split("```")[1]


def test_rows_current_stale_and_unknown(tmp_path):
    files = versions.implementation_files("triton", "indexer_topk")
    current = versions.source_hashes(files)
    edited = dict(current, **{"backends/triton/kth.py": "0" * 12})
    _artifact(tmp_path, "now.json", _rows("triton", "indexer_topk", 3), commit="abc", settings={}, sources=current)
    _artifact(tmp_path, "then.json", _rows("triton", "indexer_topk", 2), commit="def",
              settings={"DSV4OPS_TRITON_TUNING": "fp8_path=soft"}, sources=edited)
    _artifact(tmp_path, "old.json", _rows("triton", "indexer_topk", 1))
    text = report.verified_table(tmp_path)
    rows = {line.split()[-1]: line.split() for line in _rows_section(text).splitlines() if line.startswith("triton")}
    assert rows["now.json"][-2] == "current" and rows["now.json"][-3] == versions.kernel_version(current)
    assert rows["then.json"][-2] == "stale" and rows["then.json"][-3] == versions.kernel_version(edited)
    assert rows["old.json"][-3:-1] == ["unknown", "unknown"]
    assert "- then.json triton indexer_topk: triton/kth.py\n" in text
    runs = {line.split()[0]: line.split() for line in text.split("## Runs", 1)[1].split("```")[1].splitlines() if line}
    assert runs["then.json"][-2:] == ["def", "DSV4OPS_TRITON_TUNING=fp8_path=soft"]
    assert runs["now.json"][-2:] == ["abc", "-"]


def test_versions_json_versions_artifacts_that_record_none(tmp_path):
    files = versions.implementation_files("triton", "fp8_einsum")
    _artifact(tmp_path, "old.json", _rows("triton", "fp8_einsum", 1))
    (tmp_path / versions.VERSIONS_FILE).write_text(json.dumps(
        {"old.json": dict(commit="1234567", sources=versions.source_hashes(files))}))
    text = report.verified_table(tmp_path)
    assert "1234567" in text.split("## Runs", 1)[1]
    assert " current  old.json" in _rows_section(text)
    assert [p.name for p in versions.artifacts(tmp_path)] == ["old.json"]


def test_the_reference_against_itself_is_counted_apart(tmp_path):
    sources = versions.source_hashes(versions.implementation_files("triton", "fp8_einsum"))
    _artifact(tmp_path, "run.json", _rows("reference", "fp8_einsum", 4) + _rows("triton", "fp8_einsum", 2),
              commit="abc", settings={}, sources=sources)
    text = report.verified_table(tmp_path)
    assert "reference" not in _rows_section(text)
    quick = report.quick_cases()
    assert quick > 0
    assert f"Reference only: {quick + 4} cases (the reference compared with itself: not verification)" \
        in " ".join(text.split())


def test_check_json_records_commit_forcing_and_sources(tmp_path, monkeypatch):
    monkeypatch.setenv("DSV4OPS_BACKEND", "triton")
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    out = tmp_path / "run.json"
    case = cases("inv_rope_fp8_quant", "quick")[0].id
    assert cli.main(["check", "--ops", "inv_rope_fp8_quant", "--backends", "triton", "--case", case,
                     "--json", str(out)]) == 0
    meta = json.loads(out.read_text())["meta"]
    assert meta["settings"] == {"DSV4OPS_BACKEND": "triton"}
    assert meta["commit"]
    assert meta["sources"] == versions.source_hashes(versions.implementation_files("triton", "inv_rope_fp8_quant"))
    assert "backends/triton/inv_rope_fp8_quant.py" in meta["sources"]
