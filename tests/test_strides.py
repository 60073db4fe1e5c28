"""Strided, expanded and aliased arguments, generated for every op (issue 16).

Layouts the contract accepts run as the generated family in the conformance matrix
(``dsv4ops/conformance/strides.py``); here, generated over every op: every layout it does not
accept is an ``InputError`` naming the argument, with nothing written; a written argument
overlapping any other tensor argument likewise. Each op's hand-built cases (partial overlaps, scale
values, size limits) are in its own file, tests/ops/test_<op>.py."""
import pytest
import torch
from helpers import G, raises_input_error

import dsv4ops
from dsv4ops.checker import byte_span, self_overlapping, spans_intersect
from dsv4ops.conformance import build_inputs
from dsv4ops.conformance.cases import make_case
from dsv4ops.conformance.strides import aliased, contiguous_only, restride
from dsv4ops.ops import OPS

VARIANTS = ("sliced", "transposed", "expanded")
BASES = {op.name: op.spec.conformance.stride_bases["quick"] for op in OPS.values()}
LAYOUTS = {op.name: op.spec.conformance.strides for op in OPS.values()}


def _rejected_layouts():
    """(op, base params, arg, variant) the contract does not accept: every variant of a
    contiguous-only argument, and ``transposed`` for arguments that accept only row strides."""
    out = []
    for op, bases in BASES.items():
        for params in bases:
            kw = make_case(op, **params).build("cpu", 0)
            for arg in contiguous_only(op, kw):
                out += [(op, params, arg, v) for v in VARIANTS]
            for arg, accepted in LAYOUTS[op].items():
                if kw.get(arg) is not None and kw[arg].dim() >= 2 and "transposed" not in accepted:
                    out.append((op, params, arg, "transposed"))
    return out


REJECTED = _rejected_layouts()


@pytest.mark.parametrize("op,params,arg,variant", REJECTED,
                         ids=[f"{op}-{arg}-{v}-{i}" for i, (op, _, arg, v) in enumerate(REJECTED)])
def test_layout_not_accepted(op, params, arg, variant):
    kw = make_case(op, **params).build("cpu", 0)
    t = restride(kw[arg], variant)
    if t.is_contiguous():
        pytest.skip(f"{variant} {arg} of shape {list(t.shape)} is still contiguous")
    kw[arg] = t
    raises_input_error(op, kw, arg)


def test_every_op_has_a_stride_and_alias_family():
    """Each op's conformance data names the layouts its arguments accept and the bases the family
    is generated on, in both tiers (an op without them would run no stride or alias case)."""
    for op in OPS.values():
        data = op.spec.conformance
        assert data.strides, f"{op.name}: no accepted layouts (conformance.strides)"
        assert data.stride_bases["quick"] and data.stride_bases["full"], f"{op.name}: no stride bases"
        if op.spec.written:
            assert any(case[0] == op.name for case in ALIASED), f"{op.name}: no alias case"


def test_family_covers_every_argument():
    """Quick tier: every argument of LAYOUTS once; full tier: every accepted layout (same function)."""
    from dsv4ops.conformance import cases
    ids = {c.id for op in LAYOUTS for c in cases(op, "quick")}
    for op, args in LAYOUTS.items():
        for arg in args:
            assert any(i.startswith(op + "[") and f"strided={arg}:" in i for i in ids), (op, arg)


def _aliased_pairs():
    """(op, base params, written argument, other tensor argument) over the quick bases."""
    out = []
    for op, bases in BASES.items():
        written = [a.name for a in OPS[op].spec.args if a.mutated]
        kw = make_case(op, **bases[0]).build("cpu", 0)
        tensors = [k for k, v in kw.items() if isinstance(v, torch.Tensor) and v.numel()]
        out += [(op, bases[0], w, x) for w in written if w in tensors for x in tensors if x != w]
    return out


ALIASED = _aliased_pairs()


@pytest.mark.parametrize("op,params,written,other", ALIASED,
                         ids=[f"{op}-{w}-{x}" for op, _, w, x in ALIASED])
def test_written_argument_overlapping_another(op, params, written, other):
    kw = aliased(make_case(op, **params).build("cpu", 0), written, other)
    if op == "qnorm_rope_kv_insert" and {written, other} == {"out", "q"} and kw["out"].dtype == kw["q"].dtype:
        pytest.skip("out=q is the in-place form (ops/test_qnorm_rope_kv_insert.py::test_qnorm_out_is_q_in_place)")
    raises_input_error(op, kw, f"({written}|{other})", "overlap")


ACCEPTED = [(op, params, arg, v) for op, bases in BASES.items() for params in bases
            for arg, variants in LAYOUTS[op].items() for v in variants]


@pytest.mark.parametrize("op,params,arg,variant", ACCEPTED,
                         ids=[f"{op}-{arg}-{v}-{i}" for i, (op, _, arg, v) in enumerate(ACCEPTED)])
def test_reference_reads_strides(op, params, arg, variant):
    """The reference gives the same results (and writes the same buffers) for an accepted layout as
    for contiguous copies of the same values: the conformance family's ground truth is sound."""
    kw = make_case(op, **params).build("cpu", 0)
    if kw.get(arg) is None:
        pytest.skip(f"the base case has no {arg}")
    strided = {**kw, arg: restride(kw[arg], variant)}
    dense = {k: v.contiguous().clone() if isinstance(v, torch.Tensor) else v for k, v in strided.items()}
    got = getattr(dsv4ops, op)(**strided, backend="reference")
    want = getattr(dsv4ops, op)(**dense, backend="reference")
    torch.testing.assert_close(got, want, equal_nan=True)
    for k, v in dense.items():
        if isinstance(v, torch.Tensor) and k != arg:
            torch.testing.assert_close(strided[k], v, equal_nan=True, msg=k)


# --- the overlap helpers ----------------------------------------------------------------------

def may_overlap(a, b):
    return spans_intersect(byte_span(a), byte_span(b))


def test_overlap_helpers():
    buf = torch.zeros(4, 8)
    assert may_overlap(buf[:2], buf[1:3]) and not may_overlap(buf[:2], buf[2:])
    assert not may_overlap(buf, torch.zeros(4, 8))
    assert may_overlap(buf.view(torch.uint8)[0, 4:8], buf[0, 1:2])          # across dtypes, by bytes
    assert not may_overlap(buf[:0], buf)
    assert self_overlapping(buf[:1].expand(4, 8)) and not self_overlapping(buf.t())
    assert not self_overlapping(buf[:, ::2]) and self_overlapping(buf.as_strided((4, 4), (1, 1)))


def test_overlap_not_judged_on_fake_tensors():
    """Under tracing (FakeTensor) there are no addresses: the overlap check stands aside."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    from dsv4ops.checker import Checker
    from dsv4ops.ops import OPS
    kw = build_inputs("fp8_einsum", "cpu", G(), B=3, H=2, D=128, R=256, out=True)
    with FakeTensorMode(allow_non_fake_inputs=True) as mode:
        fake = {k: mode.from_tensor(v) if isinstance(v, torch.Tensor) else v for k, v in kw.items()}
        Checker("fp8_einsum").disjoint(OPS["fp8_einsum"].bind(**fake), "out")
