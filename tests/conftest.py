import pytest
import torch

from dsv4ops import selection


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch):
    """Each test starts with no backend pinning and an empty decision cache."""
    monkeypatch.delenv("DSV4OPS_BACKEND", raising=False)
    monkeypatch.delenv("DSV4OPS_PLATFORM", raising=False)
    selection.clear_cache()
    yield
    selection.clear_cache()


@pytest.fixture
def gen():
    return torch.Generator().manual_seed(1234)

