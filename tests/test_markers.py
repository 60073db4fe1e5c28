"""Every test that needs a GPU carries the ``gpu`` marker: one skipped for want of a GPU without it fails."""
from pathlib import Path

import torch

pytest_plugins = ["pytester"]

CONFTEST = Path(__file__).with_name("conftest.py").read_text()


def test_unmarked_gpu_skip_fails_and_marked_one_skips(pytester):
    pytester.makeconftest(CONFTEST)
    pytester.makepyfile(test_inner='''
import pytest

def test_unmarked():
    pytest.skip("needs a CUDA GPU")

@pytest.mark.skipif(True, reason="needs two CUDA devices")
def test_unmarked_skipif():
    pass

@pytest.mark.gpu
def test_marked():
    assert __import__("torch").cuda.is_available()

def test_other_skip():
    pytest.skip("the Triton backend is not available here")
''')
    result = pytester.runpytest("-p", "no:cacheprovider", "-rA")
    outcomes = result.parseoutcomes()
    gpu = torch.cuda.is_available()
    # a skip in the call fails; a skipif (setup) reports as an error: both make the run fail
    assert outcomes.get("failed", 0) + outcomes.get("errors", 0) == 2, result.stdout.str()
    for name in ("test_unmarked", "test_unmarked_skipif"):
        assert f"test_inner.py::{name} skipped for want of a GPU" in result.stdout.str(), name
    assert outcomes.get("skipped") == (1 if gpu else 2), result.stdout.str()
    assert outcomes.get("passed", 0) == (1 if gpu else 0), result.stdout.str()
