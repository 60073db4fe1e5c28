"""Every op's declaration is complete: each table the suite, the bench, the docs and the CLI read
is a field of its ``OpSpec``, and each must be filled for every op."""
import inspect
from pathlib import Path

import pytest
import torch

import dsv4ops
from dsv4ops import registry
from dsv4ops.conformance import build_inputs, cases, typical_case
from dsv4ops.ops import OPS

SPECS = [op.spec for op in OPS.values()]


@pytest.mark.parametrize("spec", SPECS, ids=[s.name for s in SPECS])
def test_declaration_is_complete(spec):
    data, bench = spec.conformance, spec.bench
    assert cases(spec.name, "quick") and cases(spec.name, "full")
    assert bench.production and bench.tiny and bench.matrix in ("fp8", "bf16")
    assert len(data.errors) >= 10 and data.strides and data.stride_bases["quick"] and data.stride_bases["full"]
    module, _, function = spec.reference.partition(":")
    assert callable(getattr(__import__(module, fromlist=[function]), function))
    assert [s.section for s in SPECS] == sorted(s.section for s in SPECS)


@pytest.mark.parametrize("spec", SPECS, ids=[s.name for s in SPECS])
def test_every_argument_is_documented(spec):
    """``help(dsv4ops.<op>)`` documents each argument (the spec's ``Arg.doc``)."""
    doc = inspect.getdoc(getattr(dsv4ops, spec.name))
    for arg in spec.args:
        assert arg.doc, f"{spec.name}: argument {arg.name!r} has no doc"
        assert f"    {arg.name}: {arg.doc}" in doc, arg.name
    assert f"docs/ops.md §{spec.section}" in doc


@pytest.mark.parametrize("spec", SPECS, ids=[s.name for s in SPECS])
def test_typical_tiny_and_bench_shapes_build_and_cost(spec):
    """``dsv4ops info``'s typical call and the bench's tiny call are valid calls whose cost model
    counts something."""
    for params in (spec.conformance.typical, spec.bench.tiny):
        kwargs = build_inputs(spec.name, "cpu", torch.Generator().manual_seed(0), **params)
        dsv4ops.explain(spec.name, **kwargs)
        moved, _ = spec.bench.cost(kwargs)
        assert moved > 0
    assert typical_case(spec.name).op == spec.name


def test_public_names_come_from_the_specs():
    for name, op in OPS.items():
        assert getattr(dsv4ops, name) is op.function and name in dsv4ops.__all__
        assert getattr(dsv4ops.reference, name).__signature__ == op.signature
        assert registry.get_op(name) is op
    assert tuple(dsv4ops.ops.OPS) == dsv4ops.OP_NAMES


def test_op_test_files_name_registered_ops():
    """tests/ops holds one file per op, test_<op>.py, with that op's own tests (corner cases, paths,
    hand-built error cases): none for an op that is gone or renamed. (A new op needs none to start
    with: its declared cases, error inputs and stride family run in the generic suites.)"""
    files = Path(__file__).with_name("ops").glob("test_*.py")
    assert {p.stem for p in files} <= {f"test_{name}" for name in OPS}
