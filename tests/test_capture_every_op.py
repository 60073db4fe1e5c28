"""Every op captured in a CUDA graph with automatic selection, and as a prepared call: captured on
one input set, replayed after a second set (other values: lengths, indices, positions, slots, data)
is copied into the captured buffers, and equal bit for bit to an eager call of the implementation
the capture chose on the second set (elements the op's contract leaves unspecified aside)."""
import pytest
import torch

import dsv4ops
from dsv4ops.conformance import cases, typical_case
from dsv4ops.conformance.repeat import differs
from dsv4ops.ops import OP_NAMES, OPS
from dsv4ops.tensors import clone_kwargs

pytestmark = pytest.mark.gpu
CASES = [(op, case) for op in OP_NAMES for case in [typical_case(op), *cases(op, "quick")[:3]]]


def _inputs(case, seed):
    return case.build("cuda", seed)


def _load(static: dict, fresh: dict):
    """Copy the second set's values into the captured buffers (same shapes, dtypes and scalars)."""
    for name, value in fresh.items():
        if isinstance(value, torch.Tensor):
            assert static[name].shape == value.shape and static[name].dtype == value.dtype, name
            static[name].copy_(value)
        else:
            assert static[name] == value, f"{name}: the input builder changed a scalar between seeds"


def _replay_matches_eager(op, call, backend_of, static, fresh):
    """Capture ``call(static)``, replay on ``fresh``'s values, compare with an eager call."""
    call(static)                                     # compile and load outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = call(static)
    _load(static, clone_kwargs(fresh))
    graph.replay()
    torch.cuda.synchronize()
    eager_kwargs = clone_kwargs(fresh)
    eager = OPS[op].function(**eager_kwargs, backend=backend_of)
    where = differs(OPS[op], eager_kwargs, eager, static, captured)
    assert where is None, f"{op} [{backend_of}]: the replay differs from the eager call in {where}"


@pytest.mark.parametrize("op,case", CASES, ids=[case.id for _, case in CASES])
def test_captured_with_automatic_selection(op, case):
    static, fresh = _inputs(case, 0), _inputs(case, 1)
    chosen = dsv4ops.explain(op, **clone_kwargs(static), capturable=True).backend
    assert chosen is not None, f"{op}: nothing capturable serves {case.id}"
    _replay_matches_eager(op, lambda kw: OPS[op].function(**kw), chosen, static, fresh)


@pytest.mark.parametrize("op,case", CASES, ids=[case.id for _, case in CASES])
def test_captured_prepared_call(op, case):
    static, fresh = _inputs(case, 0), _inputs(case, 1)
    prepared = dsv4ops.prepare(op, **static, capturable=True)
    tensors = lambda kw: {name: value for name, value in kw.items() if isinstance(value, torch.Tensor)}
    _replay_matches_eager(op, lambda kw: prepared(**tensors(kw)), prepared.backend, static, fresh)
