"""Strided, expanded and aliased arguments, non-finite scales and size limits (issue 16).

Layouts the contract accepts run as the generated family in the conformance matrix
(``dsv4ops/conformance/strides.py``); here: every layout it does not accept is an ``InputError``
naming the argument, with nothing written; overlapping written arguments, bad scale values and
sizes beyond the kernels' index types likewise."""
import pytest
import torch

import dsv4ops
from dsv4ops.checker import byte_span, self_overlapping, spans_intersect
from dsv4ops.conformance import build_inputs
from dsv4ops.conformance.cases import make_case
from dsv4ops.conformance.strides import aliased, contiguous_only, restride
from dsv4ops.ops import OPS

G = lambda: torch.Generator().manual_seed(7)
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


def _raises(op, kw, arg, match=None):
    """``op(**kw)`` raises an InputError naming ``arg`` and writes nothing."""
    before = {k: v.clone() for k, v in kw.items() if isinstance(v, torch.Tensor)}
    pattern = f"{op}: argument '{arg}'" + (f".*{match}" if match else "")
    for backend in ("reference", "triton"):
        with pytest.raises(dsv4ops.InputError, match=pattern):
            getattr(dsv4ops, op)(**kw, backend=backend)
    for name, t in before.items():
        assert torch.equal(kw[name].contiguous().view(torch.uint8), t.contiguous().view(torch.uint8)), name


@pytest.mark.parametrize("op,params,arg,variant", REJECTED,
                         ids=[f"{op}-{arg}-{v}-{i}" for i, (op, _, arg, v) in enumerate(REJECTED)])
def test_layout_not_accepted(op, params, arg, variant):
    kw = make_case(op, **params).build("cpu", 0)
    t = restride(kw[arg], variant)
    if t.is_contiguous():
        pytest.skip(f"{variant} {arg} of shape {list(t.shape)} is still contiguous")
    kw[arg] = t
    _raises(op, kw, arg)


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
        pytest.skip("out=q is the in-place form (test_qnorm_out_is_q_in_place)")
    before = {k: v.clone() for k, v in kw.items() if isinstance(v, torch.Tensor)}
    for backend in ("reference", "triton"):
        with pytest.raises(dsv4ops.InputError, match=f"{op}: argument '({written}|{other})' .*overlap"):
            getattr(dsv4ops, op)(**kw, backend=backend)
    for name, t in before.items():
        assert torch.equal(kw[name].contiguous().view(torch.uint8), t.contiguous().view(torch.uint8)), name


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


# --- aliasing ---------------------------------------------------------------------------------

def _qnorm(**kw):
    return build_inputs("qnorm_rope_kv_insert", "cpu", G(), T=4, H=1, block_size=16, num_blocks=2, **kw)


def test_qnorm_out_viewing_kv():
    kw = _qnorm(layout="bf16")
    kw["out"] = kw["kv"].view(4, 1, 512)
    _raises("qnorm_rope_kv_insert", kw, "out", "must not overlap 'kv'")


def test_qnorm_cache_viewing_q():
    kw = _qnorm(layout="fp8_ds_mla")
    shape, n = kw["kv_cache"].shape, kw["kv_cache"].numel()
    buf = torch.zeros(n, dtype=torch.uint8)
    kw["kv_cache"] = buf.view(shape)
    kw["q"] = buf[4096: 4096 + 4 * 512 * 2].view(torch.bfloat16).view(4, 1, 512)
    _raises("qnorm_rope_kv_insert", kw, "q", "must not overlap 'kv_cache'")        # written arguments in order


def test_qnorm_out_partly_overlapping_q():
    kw = _qnorm(layout="bf16")
    buf = torch.zeros(5, 1, 512, dtype=torch.bfloat16)
    buf[:4] = kw["q"]
    kw["q"], kw["out"] = buf[:4], buf[1:]
    _raises("qnorm_rope_kv_insert", kw, "q", "must not overlap 'out'")


@pytest.mark.parametrize("backend", ["reference", "triton"])
def test_qnorm_out_is_q_in_place(backend):
    """``out=q`` (the very same view) is the in-place form the contract allows."""
    kw = _qnorm(layout="bf16")
    want = dsv4ops.qnorm_rope_kv_insert(**{**kw, "q": kw["q"].clone(), "kv_cache": kw["kv_cache"].clone()},
                                        backend="reference").clone()
    got = dsv4ops.qnorm_rope_kv_insert(**{**kw, "out": kw["q"]}, backend=backend)
    assert got.data_ptr() == kw["q"].data_ptr() and torch.equal(got, want)


def _decode(layout="bf16"):
    return build_inputs("sparse_mla_decode", "cpu", G(), T=3, H=4, topk=16, layout=layout, block_size=16)


def test_decode_out_viewing_cache():
    kw = _decode()
    kw["out"] = kw["kv_cache"].view(-1, 512)[:12].view(3, 4, 512)
    _raises("sparse_mla_decode", kw, "out", "must not overlap 'kv_cache'")


def test_decode_cache_viewing_q():
    kw = _decode()
    shape, n = kw["kv_cache"].shape, kw["kv_cache"].numel()
    buf = kw["kv_cache"].flatten().clone()
    kw["kv_cache"] = buf.view(shape)
    kw["q"] = buf[512: 512 + kw["q"].numel()].view(kw["q"].shape)
    _raises("sparse_mla_decode", kw, "kv_cache", "must not overlap 'q'")


def test_einsum_expanded_out():
    kw = build_inputs("fp8_einsum", "cpu", G(), B=3, H=2, D=128, R=256)
    kw["out"] = torch.empty(1, 2, 128, dtype=torch.bfloat16).expand(3, 2, 128)
    _raises("fp8_einsum", kw, "out", "overlap itself")


def test_logits_out_overlapping_weights():
    kw = build_inputs("paged_mqa_logits", "cpu", G(), B=2, next_n=1, context=32, H=4, block_size=16)
    rows, width = 2, kw["max_context_len"]
    buf = torch.zeros(rows * width + 8)
    buf[:8] = kw["weights"].flatten()
    kw["weights"], kw["out"] = buf[:8].view(2, 4), buf[4:4 + rows * width].view(rows, width)
    _raises("paged_mqa_logits", kw, "out", "must not overlap 'weights'")


def test_topk_out_overlapping_row_ends():
    kw = build_inputs("indexer_topk", "cpu", G(), R=4, W=64, k=8, mode="ranges")
    buf = torch.zeros(36, dtype=torch.int32)
    buf[32:] = kw["row_ends"]
    kw["row_ends"], kw["out"] = buf[32:], buf[4:36].view(4, 8)
    _raises("indexer_topk", kw, "out", "must not overlap 'row_ends'")


# --- scale values -----------------------------------------------------------------------------

BAD_SCALES = [float("nan"), float("inf"), 0.0, -0.5]


@pytest.mark.parametrize("value", BAD_SCALES)
@pytest.mark.parametrize("name", ["kv_scale", "q_scale"])
def test_qnorm_scale_tensor_values(name, value):
    kw = _qnorm(layout="fp8_per_tensor")
    kw[name] = torch.tensor([value])
    _raises("qnorm_rope_kv_insert", kw, name, "finite and > 0")


@pytest.mark.parametrize("value", BAD_SCALES)
@pytest.mark.parametrize("name", ["kv_scale", "q_scale", "softmax_scale"])
def test_decode_scale_values(name, value):
    kw = _decode("fp8_per_tensor")
    kw[name] = value if name == "softmax_scale" else torch.tensor([value])
    _raises("sparse_mla_decode", kw, name)


@pytest.mark.parametrize("value", [float("nan"), float("inf")])
def test_qnorm_eps_finite(value):
    kw = _qnorm(layout="bf16")
    kw["eps"] = value
    _raises("qnorm_rope_kv_insert", kw, "eps")


def test_decode_nan_sink():
    kw = _decode()
    kw["attn_sink"] = torch.tensor([0.0, float("nan"), float("inf"), -float("inf")])
    _raises("sparse_mla_decode", kw, "attn_sink", "NaN")


@pytest.mark.parametrize("value", BAD_SCALES)
@pytest.mark.parametrize("name", ["a_scale", "b_scale"])
def test_einsum_block_scale_values(name, value):
    kw = build_inputs("fp8_einsum", "cpu", G(), B=3, H=2, D=128, R=256)
    kw[name] = kw[name].clone()
    kw[name].view(-1)[1] = value
    _raises("fp8_einsum", kw, name, "finite and > 0")


# --- size limits --------------------------------------------------------------------------------

def test_logits_huge_max_context_len():
    kw = build_inputs("paged_mqa_logits", "cpu", G(), B=2, next_n=1, context=32, H=4, block_size=16)
    kw["max_context_len"] = 2 ** 40
    _raises("paged_mqa_logits", kw, "max_context_len", "at most")


def test_logits_zero_block_size_cache():
    kw = build_inputs("paged_mqa_logits", "cpu", G(), B=2, next_n=1, context=32, H=4, block_size=16)
    kw["kv_cache"] = torch.empty(7, 0, 1, 132, dtype=torch.uint8)
    _raises("paged_mqa_logits", kw, "kv_cache", "block_size")


def test_topk_huge_k():
    kw = build_inputs("indexer_topk", "cpu", G(), R=4, W=64, k=8, mode="ranges")
    kw["k"] = 2 ** 40
    _raises("indexer_topk", kw, "k", "int32")


def test_topk_width_beyond_int32():
    logits = torch.zeros(1, 1).expand(2, 2 ** 31)             # no memory behind the width
    with pytest.raises(dsv4ops.InputError, match="indexer_topk: argument 'logits'.*int32"):
        dsv4ops.indexer_topk(logits, 8, seq_lens=torch.ones(2, dtype=torch.int32))


# --- expanded read-only arguments the generated family does not build --------------------------

@pytest.mark.parametrize("backend", ["reference", "triton"])
def test_topk_expanded_row_starts(backend):
    kw = build_inputs("indexer_topk", "cpu", G(), R=4, W=300, k=16, mode="ranges")
    kw["row_starts"] = torch.zeros(1, dtype=torch.int32).expand(4)
    want = dsv4ops.indexer_topk(**{**kw, "row_starts": torch.zeros(4, dtype=torch.int32)}, backend="reference")
    got = dsv4ops.indexer_topk(**kw, backend=backend)
    assert torch.equal(got.sort(1).values, want.sort(1).values)


# --- launch limits ------------------------------------------------------------------------------

def test_triton_declines_grids_cuda_cannot_launch():
    kw = build_inputs("paged_mqa_logits", "cpu", G(), B=2, next_n=1, context=32, H=4, block_size=16)
    kw["max_context_len"] = 65536 * 128                      # sm90: 128 columns per program
    with dsv4ops.simulate_platform("cuda", "sm90"):
        decision = dsv4ops.explain("paged_mqa_logits", **kw)
    status = next(c.status for c in decision.candidates if c.backend == "triton")
    assert "CUDA allows 65535" in status
    kw["max_context_len"] = 65535 * 128
    with dsv4ops.simulate_platform("cuda", "sm90"):
        decision = dsv4ops.explain("paged_mqa_logits", **kw)
    assert "CUDA allows" not in next(c.status for c in decision.candidates if c.backend == "triton")
