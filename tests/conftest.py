import pytest
import torch

from dsv4ops import selection, settings


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
