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

