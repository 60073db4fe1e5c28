"""Adding an op touches its declaration, its reference, one module per backend (its registration
line) and the docs, nothing else (docs/extending.md): a toy op declared here, with its reference
and a toy backend whose implementation declares its warm-up calls, works through dispatch,
``explain``, conformance and ``dsv4ops.warmup`` without any other module edited. The registration
is undone afterwards."""
from __future__ import annotations

import pytest
import torch

import dsv4ops
from dsv4ops import registry, selection
from dsv4ops.conformance import run_matrix, select_cases
from dsv4ops.deployment import Machine, engine_limits, model_dims
from dsv4ops.errors import InputError
from dsv4ops.opspec import Arg, BenchShapes, Conformance, OpSpec, define
from dsv4ops.ops import OPS
from dsv4ops.sampling import randn, set_args
from dsv4ops.tolerance import Collector, close
from dsv4ops.warm_up import CompileSession, representative_calls

NAME, BACKEND = "toy_scaled_rows", "toy_vendor"


def check(c, a):
    c.tensor("x", a.x, dtype=torch.float32, shape=("T", "D"), anchor=True)
    c.int_arg("factor", a.factor, minimum=1)
    return a


def toy_reference(a):
    """fp32 [T, D]: each row times ``factor``."""
    return a.x * a.factor


def inputs(device, gen, T=3, D=8, factor=2):
    return dict(x=randn(gen, T, D).to(device), factor=factor)


def compare(params, ref_kwargs, ref, got_kwargs, got):
    c = Collector()
    close(c, "result", got, ref, atol=0.0, rtol=0.0)
    return c.verdict()


SPEC = OpSpec(
    name=NAME, section=99, doc="A toy: fp32 rows ``x`` [T, D] times ``factor``.",
    args=(Arg("x", torch.Tensor, doc="fp32 [T, D]"), Arg("factor", int, doc="an integer >= 1")),
    outputs="Tensor", check=check, fake=lambda a: torch.empty_like(a.x), reference=f"{__name__}:toy_reference",
    conformance=Conformance(inputs=inputs, cases=lambda tier: (dict(T=1), dict(T=5, D=16, factor=3)),
                            typical=dict(T=2), compare=compare, strides={}, stride_bases={"quick": (), "full": ()},
                            error_base=dict(T=2), errors=(("factor", set_args(factor=0)),)),
    bench=BenchShapes(cost=lambda kw: (kw["x"].numel() * 8, kw["x"].numel()), tiny=dict(T=1), production=(dict(T=64),)),
    leading=("x",),
)


class ToyKernels:
    """A vendor whose 'JIT' compiles one kernel per D (its variant), inside its warm-up session only
    when asked to compile without running."""

    def __init__(self):
        self.compiled, self.runs, self.on_compile = set(), [], None

    def run(self, a):
        variant = ("toy_kernel", f"D={a.x.shape[1]}")
        if variant not in self.compiled:
            self.compiled.add(variant)
            if self.on_compile is not None:
                self.on_compile(variant)
        if self.on_compile is not None:                 # in the session: compiled, not run
            return None
        self.runs.append(tuple(a.x.shape))
        return a.x * a.factor

    def session(self, machine, workers, on_compile):
        import contextlib

        @contextlib.contextmanager
        def compiling():
            self.on_compile = on_compile
            try:
                yield CompileSession(cache_dir="/toy/cache")
            finally:
                self.on_compile = None
        return compiling()


def toy_warmup_calls(dims, limits, machine):
    """Its variants are the row widths: the model's heads and the window (toy choices)."""
    return [dict(T=2, D=dims.heads), dict(T=2, D=dims.window)]


@pytest.fixture
def toy(monkeypatch):
    """The toy op, its reference and a toy backend registered as an op module, the reference
    package and a backend package would register them; all of it undone afterwards."""
    registry.load_backends()
    monkeypatch.setitem(registry._ops, NAME, None)                 # undone: the name deleted again
    monkeypatch.setitem(registry._implementations, NAME, [])
    reference = registry.get_backend("reference")
    monkeypatch.setitem(reference.implementations, NAME, [])
    op = define(SPEC)                                               # what dsv4ops/ops/<op>.py does
    assert OPS[NAME] is op                                          # the one op table holds it
    reference.implements(NAME, SPEC.reference)                      # what dsv4ops/reference does per op
    kernels = ToyKernels()
    backend = registry.register_backend(registry.Backend(BACKEND, ("cuda", "cpu"), warmup_session=kernels.session))
    backend.implements(NAME, kernels.run, priority=50, warmup=toy_warmup_calls)
    yield kernels
    registry.unregister_backend(BACKEND)
    selection.clear_cache()


def test_dispatch_explain_and_validation_reach_the_toy_backend(toy):
    x = torch.randn(4, 8, generator=torch.Generator().manual_seed(1))
    assert torch.equal(dsv4ops.dispatch(NAME, x, 3), x * 3)
    assert toy.runs == [(4, 8)]
    decision = dsv4ops.explain(NAME, x, 3)
    assert decision.backend == BACKEND
    assert torch.equal(dsv4ops.dispatch(NAME, x, 3, backend="reference"), x * 3)
    with pytest.raises(InputError, match="factor"):
        dsv4ops.dispatch(NAME, x, 0)


def test_conformance_runs_the_toy_backend_against_its_reference(toy):
    results = run_matrix(select_cases([NAME], "quick"), [BACKEND], "cpu", seed=4)
    assert [r.status for r in results] == ["pass", "pass"], [r.message for r in results]


def test_warmup_runs_the_declared_calls_in_the_backends_session(toy):
    with dsv4ops.simulate_platform("cuda", "sm90") as plat:
        summary = dsv4ops.warmup([NAME], device="cpu", backends=[BACKEND])
        calls = representative_calls(NAME, model_dims(), engine_limits(), Machine(plat, torch.device("cpu"), 4))
    heads, window = model_dims().heads, model_dims().window
    assert calls == [dict(T=2, D=heads), dict(T=2, D=window)]
    (op,) = summary.ops
    assert (op.op, op.calls, op.compiled, op.vendor_calls, op.backends, op.skipped) == (NAME, 2, 2, 0, {BACKEND}, [])
    assert summary.variants == {("toy_kernel", f"D={heads}"), ("toy_kernel", f"D={window}")}
    assert summary.cache_dir == "/toy/cache" and toy.runs == []      # compiled in the session, never run


def test_an_implementation_without_a_declaration_gets_a_reason_not_an_exception(toy):
    registry.get_backend(BACKEND).implements(NAME, toy.run, priority=50)          # no warmup=
    with dsv4ops.simulate_platform("cuda", "sm90"):
        summary = dsv4ops.warmup([NAME, "inv_rope_fp8_quant"], device="cpu", backends=[BACKEND])
    ops = {o.op: o for o in summary.ops}
    toy_op, other = ops[NAME], ops["inv_rope_fp8_quant"]
    assert (toy_op.calls, toy_op.compiled) == (0, 0)
    assert toy_op.skipped == [("-", f"no implementation of {NAME} declares warm-up calls "
                                    "(implements(..., warmup=...))")]
    assert other.calls == 1                 # the other ops warm up as before
