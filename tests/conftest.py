import re

import pytest
import torch

from dsv4ops import selection, settings

# A test that needs a GPU carries the ``gpu`` marker (``pytest -m gpu`` on a GPU machine selects all of
# them); without a GPU this conftest skips it. A test skipped for want of a GPU without the marker fails.
GPU_PRESENT = torch.cuda.is_available()
_WANTS_A_GPU = re.compile(r"\bneeds (a|two) (\S+ )?(GPU|GPUs|devices)\b", re.I)


# CI's quick lane (``pytest -m quick``): every test but the compile-only ones (marked ``slow``) and the
# files that take minutes on one core, which the full lane runs: the kernels through the interpreter case
# by case at many shapes, and every vendor adapter's calls simulated against its fake.
FULL_LANE_ONLY = ("tests/ops/", "tests/test_conformance.py", "tests/test_strides.py", "tests/test_fp8_paths.py",
                  "tests/test_example.py", "tests/test_vendor_contracts.py")


def pytest_collection_modifyitems(config, items):
    skip = pytest.mark.skip(reason="needs a GPU (marked gpu)")
    for item in items:
        if item.get_closest_marker("gpu") and not GPU_PRESENT:
            item.add_marker(skip)
        path = item.nodeid.replace("\\", "/")
        if not item.get_closest_marker("slow") and not any(path.startswith(p) for p in FULL_LANE_ONLY):
            item.add_marker(pytest.mark.quick)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    if report.skipped and not item.get_closest_marker("gpu") and isinstance(report.longrepr, tuple):
        reason = report.longrepr[2]
        if _WANTS_A_GPU.search(reason) and "marked gpu" not in reason:
            report.outcome = "failed"
            report.longrepr = (f"{item.nodeid} skipped for want of a GPU ({reason!r}) but carries no gpu marker: "
                               "mark it @pytest.mark.gpu so that `pytest -m gpu` selects it")


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch):
    """Each test starts with no DSV4OPS_* variable set and an empty decision cache."""
    for name in settings.VARIABLES:
        monkeypatch.delenv(name, raising=False)
    settings.reload()
    yield
    selection.clear_cache()


@pytest.fixture
def env(monkeypatch):
    """``env(DSV4OPS_BACKEND="triton", ...)``: set variables for this test and re-read the settings."""
    def set_env(**values):
        for name, value in values.items():
            monkeypatch.setenv(name, value)
        settings.reload()
    return set_env


@pytest.fixture
def validations(monkeypatch):
    """``validations(op_name)``: a list that grows by one each time that op validates a call."""
    from dsv4ops.ops import OPS

    def watch(op_name: str) -> list:
        validated, real = [], OPS[op_name].validate
        monkeypatch.setattr(OPS[op_name], "validate", lambda args: validated.append(1) or real(args))
        return validated
    return watch


@pytest.fixture
def gen():
    return torch.Generator().manual_seed(1234)


FP8_TYPES = ("fp8e4nv", "fp8e4b8", "fp8e4b15", "fp8e5", "fp8e5b16")


@pytest.fixture
def no_fp8_types(monkeypatch):
    """The interpreter refuses every fp8 conversion and bitcast: what runs is the integer path."""
    from triton.runtime import interpreter

    convert = interpreter._convert_float

    def guarded_convert(data, src, dst, rounding):
        assert src.name not in FP8_TYPES and dst.name not in FP8_TYPES, f"fp8 conversion {src} -> {dst}"
        return convert(data, src, dst, rounding)

    bitcast = interpreter.InterpreterBuilder.create_bitcast

    def guarded_bitcast(self, src, dst_type):
        assert dst_type.scalar.name not in FP8_TYPES, f"bitcast to {dst_type}"
        return bitcast(self, src, dst_type)

    monkeypatch.setattr(interpreter, "_convert_float", guarded_convert)
    monkeypatch.setattr(interpreter.InterpreterBuilder, "create_bitcast", guarded_bitcast)
