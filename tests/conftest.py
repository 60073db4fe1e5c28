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
def gen():
    return torch.Generator().manual_seed(1234)

