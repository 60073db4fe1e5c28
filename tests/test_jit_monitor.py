"""The JIT compile monitor (dsv4ops/jit_monitor.py): modes, the setting, and Triton's hook chaining.

A real compile needs a GPU, so Triton's ``jit_cache_hook`` is called here as Triton calls it."""
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from dsv4ops import jit_monitor, settings
from dsv4ops.errors import ConfigError


@pytest.fixture(autouse=True)
def _fresh(monkeypatch):
    monkeypatch.delenv("DSV4OPS_JIT_MONITOR", raising=False)
    settings.reload()
    jit_monitor.clear()
    yield
    jit_monitor.set_mode(None)
    jit_monitor.clear()
    monkeypatch.delenv("DSV4OPS_JIT_MONITOR", raising=False)
    settings.reload()


def _compile(module="dsv4ops.backends.triton.mqa_logits", name="_mqa_logits_kernel", key="key(i32,BLOCK=64)"):
    """Call the hook the way Triton 3.6 to 3.9 do before a compile."""
    return jit_monitor._cache_hook(key=key, repr=name, fn=SimpleNamespace(module=module, name=name, jit_function=None),
                                   compile={"key": key}, is_manual_warmup=False, already_compiled=False)


def test_off_by_default_records_nothing():
    assert jit_monitor.mode() == "off"
    assert _compile() is None
    assert jit_monitor.compiles() == []


def test_warn_names_op_backend_and_variant():
    jit_monitor.set_mode("warn")
    with pytest.warns(jit_monitor.JitCompileWarning, match=r"mqa_logits \(triton\).*_mqa_logits_kernel.*BLOCK=64"):
        _compile()
    [event] = jit_monitor.compiles()
    assert (event.op, event.backend, event.variant) == ("mqa_logits", "triton", "key(i32,BLOCK=64)")


def test_error_from_the_environment(monkeypatch):
    monkeypatch.setenv("DSV4OPS_JIT_MONITOR", "error")
    settings.reload()
    with pytest.raises(jit_monitor.JitCompileError, match="paged_mqa_topk"):
        _compile(module="dsv4ops.backends.triton.paged_mqa_topk")


def test_count_records_silently_and_ignores_other_kernels(recwarn):
    jit_monitor.set_mode("count")
    _compile()
    _compile(module="someone_else.kernels")
    assert [e.op for e in jit_monitor.compiles()] == ["mqa_logits"]
    assert not recwarn.list


def test_bad_modes_are_config_errors(monkeypatch):
    with pytest.raises(ConfigError, match="jit monitor mode"):
        jit_monitor.set_mode("loud")
    monkeypatch.setenv("DSV4OPS_JIT_MONITOR", "loud")
    with pytest.raises(ConfigError, match="DSV4OPS_JIT_MONITOR"):
        settings.reload()


def test_previous_hook_is_chained(monkeypatch):
    pytest.importorskip("triton")
    from triton import knobs

    seen = []
    monkeypatch.setattr(jit_monitor, "_previous_hook", lambda **kw: seen.append(kw["key"]) or True)
    jit_monitor.set_mode("count")
    assert _compile(key="k1") is True              # the previous hook's answer (skip the compile) is kept
    assert seen == ["k1"] and len(jit_monitor.compiles()) == 1
    assert jit_monitor.install() and knobs.runtime.jit_cache_hook is jit_monitor._cache_hook


# A real compile, for sm90 on this CPU (tests/compile_only.py's driver): the hook sees each new
# variant once, names the op, and stays quiet when the same variant runs again.
REAL_COMPILE = r"""
import sys
sys.path.insert(0, sys.argv[1])
import compile_only
from triton.runtime import driver
from triton.runtime.jit import JITFunction
driver.set_active(compile_only.CompileOnlyDriver(compile_only.TARGETS["cuda:sm90"]))
launch = JITFunction.run
JITFunction.run = lambda self, *args, grid, warmup, **kwargs: launch(self, *args, grid=grid, warmup=True, **kwargs)
import dsv4ops
from dsv4ops import jit_monitor, registry
from dsv4ops.conformance.cases import cases
from dsv4ops.ops import OPS
op = "inv_rope_fp8_quant"
triton = registry.get_backend("triton")
triton.implementations[op][0].fn
jit_monitor.set_mode("count")
with dsv4ops.simulate_platform("cuda", "sm90") as plat:
    calls = [OPS[op].validate_call(**case.build("cpu", 0)) for case in cases(op, "quick")]
    run = [(compile_only.accepting(triton.implementations[op], plat, c.key).bound(plat), c.args) for c in calls]
    for fn, args in run:
        fn(args)
    first = jit_monitor.compiles()
    assert first and {(e.op, e.backend) for e in first} == {(op, "triton")}, first
    jit_monitor.set_mode("error")
    for fn, args in run:                            # every variant is cached now: no error
        fn(args)
    assert jit_monitor.compiles() == first, "a variant compiled twice"
print("OK", first[0])
"""


@pytest.mark.slow
def test_a_real_compile_is_seen_once():
    pytest.importorskip("triton")
    env = {k: v for k, v in os.environ.items() if k not in ("TRITON_INTERPRET", "DSV4OPS_JIT_MONITOR")}
    result = subprocess.run([sys.executable, "-c", REAL_COMPILE, str(Path(__file__).parent)],
                            capture_output=True, text=True, env=env, timeout=600, check=False)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "OK inv_rope_fp8_quant (triton)" in result.stdout
