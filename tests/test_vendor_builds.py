"""Capability checks that depend on which vendor build is installed read declared data (the
distribution's name and version), never launch a kernel."""
from dsv4ops.backends import flashmla

import dsv4ops


def test_flashmla_build_without_sm90_kernels_is_declined_on_sm90(monkeypatch):
    monkeypatch.setattr(flashmla, "_distribution", lambda: ("sgl-flash-mla", "1.0.0"))
    sm90, sm100 = dsv4ops.Platform("cuda", "sm90", "H100"), dsv4ops.Platform("cuda", "sm100", "B200")
    assert "ships no sm90 kernels" in flashmla.build_has_kernels(sm90, None)
    assert flashmla.build_has_kernels(sm100, None) is None
    monkeypatch.setattr(flashmla, "_distribution", lambda: ("tokenspeed-flashmla", "1.0.0.post20260615"))
    assert flashmla.build_has_kernels(sm90, None) is None
