"""DSV4OPS_VERIFY: the setting's syntax, and ``verify.wrap`` catching deliberately broken
implementations (registered as test backends) while passing correct ones, in-place ops included."""
import dataclasses
import logging

import pytest
import torch

import dsv4ops
from dsv4ops import registry, settings, verify
from dsv4ops.conformance.cases import make_case
from dsv4ops.errors import ConfigError, VerificationError
from dsv4ops.ops import OPS
from dsv4ops.registry import Backend, register_backend, unregister_backend


@pytest.mark.parametrize("value,expected", [
    ("", settings.VerifyConfig()), ("0", settings.VerifyConfig()), ("off", settings.VerifyConfig()),
    ("1", settings.VerifyConfig(1.0)), (" 0.01 ", settings.VerifyConfig(0.01)),
    ("0.5,raise", settings.VerifyConfig(0.5, "raise")), ("1e-3, log, dump=/tmp/x", settings.VerifyConfig(1e-3, "log", "/tmp/x")),
])
def test_parse(value, expected):
    assert settings.parse_verify(value) == expected
    assert settings.parse_verify(value).enabled == (expected.rate > 0)


@pytest.mark.parametrize("value,message", [
    ("yes", "the rate 'yes' must be a fraction in (0, 1]"), ("2", "the rate '2'"), ("-0.1", "the rate '-0.1'"),
    ("nan", "the rate 'nan'"), ("0.1,explode", "bad option 'explode'"), ("0.1,raise,log", "bad option 'log'"),
    ("0.1,dump=", "bad option 'dump='"), (",raise", "the rate ''"),
])
def test_parse_rejects(value, message):
    with pytest.raises(ConfigError, match=r"DSV4OPS_VERIFY=.*" + message.replace("(", r"\(").replace("]", r"\]")):
        settings.parse_verify(value)


def _reference(op):
    return registry.get_backend("reference").implementations[op][0].fn


@pytest.fixture
def broken():
    """A test backend whose indexer_topk drops each row's best index, and whose qnorm_rope_kv_insert
    leaves one written cache byte wrong; 'honest' computes both with the reference."""
    def topk(a):
        out = _reference("indexer_topk")(a)
        return torch.cat([out[:, 1:], torch.full_like(out[:, :1], -1)], 1)

    def insert(a):
        result = _reference("qnorm_rope_kv_insert")(a)
        a.kv_cache.view(-1)[0] ^= 1
        return result

    b = register_backend(Backend("broken", ("cpu",)))
    b.implements("indexer_topk", topk, priority=1)
    b.implements("qnorm_rope_kv_insert", insert, priority=1)
    h = register_backend(Backend("honest", ("cpu",)))
    h.implements("indexer_topk", lambda a: _reference("indexer_topk")(a), priority=1)
    h.implements("qnorm_rope_kv_insert", lambda a: _reference("qnorm_rope_kv_insert")(a), priority=1)
    yield
    unregister_backend("broken")
    unregister_backend("honest")


def impl(backend, op):
    """``backend``'s implementation of ``op`` as dispatch runs it on the CPU (its context bound)."""
    return registry.get_backend(backend).implementations[op][0].bound(dsv4ops.platform("cpu"))


def typed(op, **params):
    return OPS[op].validate_call(**make_case(op, **params).build("cpu", 0)).args


TOPK = dict(R=6, W=300, k=16, mode="decode2d", next_n=2)
INSERT = dict(T=5, H=3, layout="fp8_ds_mla", block_size=16, num_blocks=3)


def test_broken_backend_raises_with_reproducer(broken, tmp_path):
    fn = verify.wrap(OPS["indexer_topk"], impl("broken", "indexer_topk"), 1.0, "raise", backend="broken",
                     dump_dir=str(tmp_path))
    args = typed("indexer_topk", **TOPK)
    with pytest.raises(VerificationError) as info:
        fn(args)
    message = str(info.value)
    assert message.startswith("DSV4OPS_VERIFY: indexer_topk on broken differs from the reference: ")
    assert "logits=float32[6, 300] stride (300, 1) on cpu" in message and "k=16" in message
    (dump,) = tmp_path.glob("indexer_topk-broken-*.pt")
    assert str(dump) in message
    assert not verify.replay(str(dump)).ok                          # the recorded backend, again
    assert verify.replay(str(dump), backend="reference").ok
    saved = torch.load(dump, weights_only=True)
    assert torch.equal(saved["kwargs"]["logits"], args.logits)


def test_in_place_op_inputs_copied_before_the_call(broken, tmp_path):
    """qnorm_rope_kv_insert rewrites q and the cache in place: the reference must see them as they
    were before the implementation ran, and so must the saved inputs."""
    args = typed("qnorm_rope_kv_insert", **INSERT)
    pristine = args._replace(q=args.q.clone(), kv_cache=args.kv_cache.clone())
    honest = verify.wrap("qnorm_rope_kv_insert", impl("honest", "qnorm_rope_kv_insert"), 1.0, "raise")
    honest(args)                                                    # no false alarm
    args = pristine._replace(q=pristine.q.clone(), kv_cache=pristine.kv_cache.clone())
    fn = verify.wrap("qnorm_rope_kv_insert", impl("broken", "qnorm_rope_kv_insert"), 1.0, "raise",
                     backend="broken", dump_dir=str(tmp_path))
    with pytest.raises(VerificationError, match="cache: 1 bytes differ"):
        fn(args)
    saved = torch.load(next(tmp_path.glob("*.pt")), weights_only=True)["kwargs"]
    assert torch.equal(saved["q"].view(torch.int16), pristine.q.view(torch.int16))
    assert torch.equal(saved["kv_cache"], pristine.kv_cache) and saved["layout"] == "fp8_ds_mla"


def test_log_action_and_sampling(broken, tmp_path, caplog):
    fn = verify.wrap(OPS["indexer_topk"], impl("broken", "indexer_topk"), 0.25, "log", backend="broken",
                     dump_dir=str(tmp_path))
    args = typed("indexer_topk", **TOPK)
    with caplog.at_level(logging.ERROR, logger="dsv4ops.verify"):
        results = [fn(args) for _ in range(14)]                     # calls 0, 4, 8 and 12 are verified
    assert len(caplog.records) == 4 and len(list(tmp_path.glob("*.pt"))) == verify.MAX_DUMPS == 3
    assert "Inputs not saved: 3 calls of indexer_topk on broken were saved already." in caplog.records[-1].message
    assert all(torch.equal(r, impl("broken", "indexer_topk")(args)) for r in results)   # its result, as is


def test_correct_backends_pass(broken):
    assert registry.get_backend("triton").unavailable_reason() is None    # the probe fixes the interpreter
    for backend in ("honest", "triton"):
        fn = verify.wrap(OPS["indexer_topk"], impl(backend, "indexer_topk"), 1.0, "raise")
        fn(typed("indexer_topk", **TOPK))


def test_off_or_reference_wraps_nothing(broken):
    fn = impl("broken", "indexer_topk")
    assert verify.wrap(OPS["indexer_topk"], fn, 0.0, "raise") is fn
    assert verify.wrap(OPS["indexer_topk"], _reference("indexer_topk"), 1.0, "raise") is _reference("indexer_topk")
    with pytest.raises(ConfigError, match="action 'panic'"):
        verify.wrap(OPS["indexer_topk"], fn, 1.0, "panic")


def test_never_during_graph_capture(broken, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: True)
    fn = verify.wrap(OPS["indexer_topk"], impl("broken", "indexer_topk"), 1.0, "raise")
    fn(typed("indexer_topk", **TOPK))                               # not verified: no raise


def test_a_failing_verification_never_breaks_the_call(broken, monkeypatch, caplog):
    spec = OPS["indexer_topk"].spec
    monkeypatch.setattr(OPS["indexer_topk"], "spec", dataclasses.replace(
        spec, conformance=dataclasses.replace(spec.conformance, compare=lambda *a: 1 / 0)))
    fn = verify.wrap(OPS["indexer_topk"], impl("honest", "indexer_topk"), 1.0, "raise", backend="honest")
    with caplog.at_level(logging.WARNING, logger="dsv4ops.verify"):
        assert fn(typed("indexer_topk", **TOPK)).shape == (6, 16)
    assert "could not verify indexer_topk on honest: ZeroDivisionError" in caplog.text


def test_dispatch_verifies_when_the_setting_is_on(env, broken, tmp_path):
    """End to end: DSV4OPS_VERIFY makes plain and prepared calls verify; off, dispatch runs the
    implementation itself (nothing wrapped, nothing to pay)."""
    kw = make_case("indexer_topk", **TOPK).build("cpu", 0)
    call = OPS["indexer_topk"].validate_call(**kw)
    decision = dsv4ops.selection.choose(call, "honest")
    assert dsv4ops.selection.runner(decision, call.device) is decision.selected.fn
    dsv4ops.indexer_topk(**kw, backend="broken")                    # off: the wrong result goes through
    env(DSV4OPS_VERIFY=f"1,raise,dump={tmp_path}")
    with pytest.raises(VerificationError, match="indexer_topk on broken differs"):
        dsv4ops.indexer_topk(**kw, backend="broken")
    with pytest.raises(VerificationError):
        dsv4ops.prepare("indexer_topk", **kw, backend="broken").run()
    assert torch.equal(dsv4ops.indexer_topk(**kw, backend="honest"), dsv4ops.reference.indexer_topk(**kw))


def test_bad_verify_setting_is_config_error(env):
    with pytest.raises(dsv4ops.ConfigError, match="DSV4OPS_VERIFY"):
        env(DSV4OPS_VERIFY="2")
