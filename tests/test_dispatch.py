"""Selection order, DSV4OPS_BACKEND syntax, forced-backend errors, explain, simulated platforms."""
import contextlib
import functools
import subprocess
import sys
import threading
import warnings

import pytest
import torch

import dsv4ops
from dsv4ops import registry, selection, settings, tensor_guard
from dsv4ops.backend_support import arch_in
from dsv4ops.conformance import build_inputs
from dsv4ops.registry import Backend, register_backend, unregister_backend


def topk_args():
    return build_inputs("indexer_topk", "cpu", torch.Generator().manual_seed(0), R=4, W=64, k=8, mode="ranges")


@pytest.fixture
def fakes():
    """Two fake backends serving indexer_topk on the CPU: 'fast' (priority 90, declines k > 16) and
    'slow' (priority 60). Each records its calls and computes with the reference."""
    calls = []

    def make(name):
        def impl(args):                               # implementations receive the typed args
            calls.append(name)
            return registry.get_backend("reference").implementations["indexer_topk"][0].fn(args)
        return impl

    fast = register_backend(Backend("fast", ("cpu", "cuda")))
    fast.implements("indexer_topk", make("fast"), priority=90,
                    supports=lambda plat, call: None if call.k <= 16 else f"k={call.k} > 16")
    slow = register_backend(Backend("slow", ("cpu",)))
    slow.implements("indexer_topk", make("slow"), priority=60)   # above the in-tree backends
    yield calls
    unregister_backend("fast")
    unregister_backend("slow")


def test_priority_then_capability(fakes):
    kw = topk_args()
    dsv4ops.indexer_topk(**kw)
    assert fakes == ["fast"]
    dsv4ops.indexer_topk(**{**kw, "k": 32})
    assert fakes[-1] == "slow"                        # fast declines k > 16, slow outranks reference
    d = dsv4ops.explain("indexer_topk", **{**kw, "k": 32})
    assert d.backend == "slow" and d.source == "priority"
    status = {c.backend: c.status for c in d.candidates}
    assert status["fast"] == "k=32 > 16" and status["reference"] == "available, lower priority"
    assert "slow (by priority)" in str(d)


def test_argument_beats_env_beats_priority(env, fakes, monkeypatch):
    kw = topk_args()
    env(DSV4OPS_BACKEND="indexer_topk=slow")
    dsv4ops.indexer_topk(**kw)
    assert fakes[-1] == "slow"
    dsv4ops.indexer_topk(**kw, backend="fast")
    assert fakes[-1] == "fast"
    env(DSV4OPS_BACKEND="sparse_mla_decode=reference,*=slow")
    dsv4ops.indexer_topk(**kw)
    assert fakes[-1] == "slow"
    env(DSV4OPS_BACKEND="reference")
    n = len(fakes)
    dsv4ops.indexer_topk(**kw)
    assert len(fakes) == n                             # global pin to reference


def test_forced_backend_never_falls_back(env, fakes, monkeypatch):
    kw = {**topk_args(), "k": 32}
    with pytest.raises(dsv4ops.UnsupportedError, match="fast: k=32 > 16"):
        dsv4ops.indexer_topk(**kw, backend="fast")
    env(DSV4OPS_BACKEND="indexer_topk=fast")
    with pytest.raises(dsv4ops.UnsupportedError, match="forced by DSV4OPS_BACKEND"):
        dsv4ops.indexer_topk(**kw)
    env(DSV4OPS_BACKEND="indexer_topk=fast|slow")   # an explicit fallback list
    dsv4ops.indexer_topk(**kw)
    assert fakes[-1] == "slow"
    with pytest.raises(dsv4ops.UnsupportedError, match="no such backend"):
        dsv4ops.indexer_topk(**topk_args(), backend="nope")


@pytest.mark.parametrize("value,bad", [
    ("indexer_topk=", "indexer_topk="), ("nonsense_op=triton", "nonsense_op"), ("*=nope", "nope"),
    ("indexer_topk=reference,indexer_topk=triton", "given twice"), ("a=b=c", "a=b=c"),
])
def test_malformed_env_is_config_error(env, monkeypatch, value, bad):
    env(DSV4OPS_BACKEND=value)
    with pytest.raises(dsv4ops.ConfigError, match=bad.replace("*", r"\*").replace("|", r"\|")):
        dsv4ops.indexer_topk(**topk_args())


def test_env_parsing():
    table = selection.parse_backend_env("sparse_mla_decode=reference|triton, *=reference")
    assert table["sparse_mla_decode"].backends == ("reference", "triton")
    assert not table["sparse_mla_decode"].strict and table["*"].strict
    assert selection.parse_backend_env("triton")["*"].backends == ("triton",)
    assert selection.parse_backend_env("") == {}
    assert selection.parse_backend_env("reference,")["*"].backends == ("reference",)   # trailing comma


def test_simulated_platform_explain(fakes):
    kw = topk_args()
    with dsv4ops.simulate_platform("cuda", "sm100"):
        assert dsv4ops.platform().arch == "sm100"
        d = dsv4ops.explain("indexer_topk", **kw)
        status = {c.backend: c.status for c in d.candidates}
        assert "platform cuda not supported" in status["slow"]
        assert d.backend == "fast"
    with dsv4ops.simulate_platform("rocm", "gfx942"):
        d = dsv4ops.explain("indexer_topk", **kw)
        assert {c.backend: c.status for c in d.candidates}["fast"].startswith("platform rocm not supported")


def test_platform_env_simulation(env, monkeypatch):
    env(DSV4OPS_PLATFORM="xpu:xpu")
    assert dsv4ops.platform().vendor == "xpu"
    env(DSV4OPS_PLATFORM="tpu")
    with pytest.raises(dsv4ops.ConfigError):
        dsv4ops.platform()


def test_arch_check_helper():
    with dsv4ops.simulate_platform("cuda", "sm90"):
        assert arch_in("sm100")(dsv4ops.platform(), None) == "arch sm90 not supported (needs sm100)"


def test_decisions_are_cached_and_thread_safe(fakes):
    kw = topk_args()
    selection.clear_cache()
    errors = []

    def worker():
        try:
            for _ in range(20):
                dsv4ops.indexer_topk(**kw)
        except Exception as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=worker) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors and set(fakes) == {"fast"}
    keys = [k for k in selection._decisions if k[0] == "indexer_topk"]
    assert len(keys) == 1
    dsv4ops.indexer_topk(**{**kw, "logits": torch.randn(7, 64), "row_starts": torch.zeros(7, dtype=torch.int32),
                            "row_ends": torch.full((7,), 64, dtype=torch.int32)})
    assert len([k for k in selection._decisions if k[0] == "indexer_topk"]) == 2   # one entry per structure
    assert fakes[-1] == "fast"                                                      # the same decision


def test_dispatch_by_name_and_unknown_op():
    kw = topk_args()
    assert torch.equal(dsv4ops.dispatch("indexer_topk", **kw, backend="reference"), dsv4ops.reference.indexer_topk(**kw))
    with pytest.raises(dsv4ops.InputError, match="unknown op"):
        dsv4ops.dispatch("nope")


def test_every_backend_registered_and_honest():
    infos = {b.name: b for b in dsv4ops.backends()}
    assert {"reference", "triton", "flashmla", "deepgemm", "flashinfer", "aiter", "xpu"} <= set(infos)
    for b in infos.values():
        assert b.available or b.reason


def test_import_loads_no_vendor_library():
    code = ("import sys, dsv4ops; heavy = [m for m in ('triton', 'flash_mla', 'deep_gemm', 'flashinfer', 'aiter',"
            " 'intel_extension_for_pytorch', 'vllm_xpu_kernels') if m in sys.modules]; assert not heavy, heavy")
    subprocess.run([sys.executable, "-c", code], check=True)


@pytest.fixture(params=["compiled guards", "structure key only"])
def fast_path(request, monkeypatch):
    """CPU calls treated as accelerator calls (they may skip validation), with the compiled tensor
    guards in use or, as where the private API is missing, the Python structure key alone."""
    if request.param == "compiled guards" and not tensor_guard.AVAILABLE:
        pytest.skip("this torch has no usable TensorGuards (the other parametrization covers the fallback)")
    monkeypatch.setattr(tensor_guard, "AVAILABLE", request.param == "compiled guards")
    monkeypatch.setattr(selection, "skips_validation", lambda device: not settings.current().debug)
    selection.clear_cache()
    yield request.param
    selection.clear_cache()


def test_fast_path_skips_validation_only_for_known_structures(env, fakes, validations, fast_path):
    """On accelerators a structure seen before skips validation and selection; anything new
    (shape, dtype, a scalar's type, backend setting) goes through both again."""
    validated = validations("indexer_topk")
    kw = topk_args()
    for _ in range(3):
        dsv4ops.indexer_topk(**kw)
    assert len(validated) == 1 and fakes == ["fast"] * 3
    assert len(selection.recent_structures("indexer_topk")) == (fast_path == "compiled guards")
    dsv4ops.indexer_topk(**{**kw, "k": 32})                     # new structure: validated, other backend
    assert len(validated) == 2 and fakes[-1] == "slow"
    with pytest.raises(dsv4ops.InputError, match="'k'"):
        dsv4ops.indexer_topk(**{**kw, "k": 8.0})                # equal to a validated 8, but a float
    with pytest.raises(dsv4ops.InputError, match="'next_n'"):
        dsv4ops.indexer_topk(**{**kw, "next_n": [1]})           # unhashable: validated, not a TypeError
    assert len(validated) == 4
    env(DSV4OPS_BACKEND="reference")
    dsv4ops.indexer_topk(**kw)
    assert len(validated) == 5 and fakes[-1] == "slow"           # reference ran: no fake call recorded
    with pytest.raises(dsv4ops.InputError):
        dsv4ops.indexer_topk(**{**kw, "logits": kw["logits"].double()})
    env(DSV4OPS_DEBUG="1")
    dsv4ops.indexer_topk(**kw)
    dsv4ops.indexer_topk(**kw)
    assert len(validated) == 8                                   # debug: always validated


def test_fast_path_many_structures_in_turn(fakes, validations, fast_path):
    """More structures than the recent-guard list holds, called in turn (layers of different kinds),
    some with one tensor passed for two arguments (which the compiled guard refuses), optional
    tensors present and absent: each call gets its own structure's decision, each structure is
    validated once, and a value change the structure does not see is not re-validated."""
    base = topk_args()
    shared = torch.zeros(4, dtype=torch.int32)
    variants = [dict(base, k=k) for k in (4, 8, 16, 32)]                 # k > 16: only 'slow' serves it
    variants += [dict(base, logits=torch.randn(4, width)) for width in (72, 88, 104)]
    variants += [dict(base, row_starts=shared, row_ends=torch.full((4,), 40, dtype=torch.int32)),
                 dict(base, row_starts=shared, row_ends=shared + 40)]    # both: the structure of k=8
    variants.append(dict(base, row_starts=None, row_ends=None, seq_lens=torch.full((4,), 60, dtype=torch.int32)))
    assert len(variants) > selection.RECENT
    expected = [dsv4ops.reference.indexer_topk(**kw) for kw in variants]
    validated = validations("indexer_topk")
    for round_ in range(3):
        for i, kw in enumerate(variants):
            fakes.clear()
            got = dsv4ops.indexer_topk(**kw)
            assert fakes == ["slow" if kw["k"] > 16 else "fast"], (round_, i)
            assert torch.equal(got, expected[i]), (round_, i)
    assert len(validated) == len(variants) - 2                           # once per structure


def test_settings_are_a_snapshot(monkeypatch, fakes):
    """The environment is read once; reload() re-reads it and drops cached decisions."""
    kw = topk_args()
    dsv4ops.indexer_topk(**kw)
    monkeypatch.setenv("DSV4OPS_BACKEND", "indexer_topk=slow")
    dsv4ops.indexer_topk(**kw)
    assert fakes == ["fast", "fast"]
    settings.reload()
    dsv4ops.indexer_topk(**kw)
    assert fakes[-1] == "slow"


@pytest.mark.parametrize("name,value", [("DSV4OPS_DEBUG", "maybe"), ("DSV4OPS_DEBUG", "2")])
def test_malformed_flag_is_config_error(monkeypatch, name, value):
    monkeypatch.setenv(name, value)
    with pytest.raises(dsv4ops.ConfigError, match=name):
        settings.reload()


def test_unknown_variable_is_warned_once_with_the_closest_name(monkeypatch):
    monkeypatch.setattr(settings, "_warned", set())
    monkeypatch.setenv("DSV4OPS_BACKENDS", "triton")
    monkeypatch.setenv("DSV4OPS_ZZZ", "1")
    monkeypatch.setenv("DSV4OPS_TIER", "full")             # the test suite's own variable: known
    with pytest.warns(UserWarning) as caught:
        settings.reload()
    texts = sorted(str(w.message) for w in caught)
    assert len(texts) == 2 and "DSV4OPS_BACKENDS is not a dsv4ops variable" in texts[0]
    assert "did you mean DSV4OPS_BACKEND?" in texts[0] and "dsv4ops reads DSV4OPS_BACKEND, " in texts[1]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        settings.reload()                                   # once per process


@pytest.mark.parametrize("value,on", [("0", False), ("false", False), ("off", False), ("1", True), ("Yes", True)])
def test_debug_flag_values(env, value, on):
    env(DSV4OPS_DEBUG=value)
    assert settings.debug_enabled() is on


@pytest.mark.parametrize("value", ["cuda:bogus", "rocm:sm90", "cuda:", "tpu:v5"])
def test_bad_simulated_platform(env, value):
    env(DSV4OPS_PLATFORM=value)
    with pytest.raises(dsv4ops.ConfigError, match="DSV4OPS_PLATFORM"):
        dsv4ops.platform()


def test_malformed_backend_env_is_an_error_even_with_backend_argument(env):
    env(DSV4OPS_BACKEND="*=nope")
    with pytest.raises(dsv4ops.ConfigError, match="nope"):
        dsv4ops.indexer_topk(**topk_args(), backend="reference")


def test_capability_checks_see_only_the_dispatch_key():
    from dsv4ops.conformance.cases import make_case
    from dsv4ops.ops import OPS
    kw = make_case("sparse_mla_decode", T=5, H=8, topk=32, layout="fp8_ds_mla").build("cpu", 0)
    key = OPS["sparse_mla_decode"].validate_call(**kw).key
    assert key.q.shape == (None, 8, 512) and key.layout.name == "fp8_ds_mla" and key.size_class == 3
    with pytest.raises(AttributeError, match="not part of sparse_mla_decode's dispatch key"):
        key.softmax_scale                                        # a float: decisions may not depend on it


def test_forced_backend_is_checked_alone(fakes):
    """Forcing a backend evaluates only it: no other backend's check or probe runs."""
    asked = []
    probe = register_backend(Backend("probe_counter", ("cpu",)))
    probe.implements("indexer_topk", lambda a: None, priority=95, supports=lambda p, k: asked.append(1))
    try:
        dsv4ops.indexer_topk(**topk_args(), backend="slow")
        assert not asked
        d = dsv4ops.explain("indexer_topk", **topk_args(), backend="slow")
        assert {c.backend: c.status for c in d.candidates}["fast"] == "not evaluated, excluded by backend= argument"
    finally:
        unregister_backend("probe_counter")


H100 = "NVIDIA H100 80GB HBM3"


def test_preference_by_heads_and_size_class():
    """H100: the Triton decode outranks FlashMLA up to 64 heads and 255 tokens, the Triton prefill up
    to 64 heads from 2048 tokens (measured)."""
    from dsv4ops.conformance.cases import make_case
    from dsv4ops.ops import OPS
    from dsv4ops.priorities import preferred

    def prefs(op, T, H):
        kw = make_case(op, **dict(T=T, H=H, topk=32, layout="fp8_ds_mla")).build("cpu", 0)
        return preferred(op, dsv4ops.platform(), OPS[op].validate_call(**kw).key)

    with dsv4ops.simulate_platform("cuda", "sm90", H100):
        decode = functools.partial(prefs, "sparse_mla_decode")
        assert decode(T=8, H=16) == decode(T=128, H=64) == {"triton": "flashmla"}
        assert decode(T=8, H=128) == {} and decode(T=256, H=64) == {}
        prefill = functools.partial(prefs, "sparse_mla_prefill")
        assert prefill(T=2048, H=64) == {"triton": "flashmla"}
        assert prefill(T=1024, H=64) == {} and prefill(T=2048, H=128) == {}
    with dsv4ops.simulate_platform("cuda", "sm100"):
        assert prefs("sparse_mla_decode", T=8, H=16) == {}


def test_preference_for_triton_logits_by_next_n_and_context():
    """H100: the Triton paged logits outrank DeepGEMM's for one token per request up to 8K (measured)."""
    from dsv4ops.conformance.cases import make_case
    from dsv4ops.ops import OPS
    from dsv4ops.priorities import preferred

    def prefs(next_n, context):
        kw = make_case("paged_mqa_logits", B=2, next_n=next_n, context=context).build("cpu", 0)
        return preferred("paged_mqa_logits", dsv4ops.platform(), OPS["paged_mqa_logits"].validate_call(**kw).key)

    with dsv4ops.simulate_platform("cuda", "sm90", H100):
        assert prefs(1, 2048) == {"triton": "deepgemm"} and prefs(1, 8192) == {"triton": "deepgemm"}
        assert prefs(2, 2048) == {} and prefs(1, 16384) == {}
    with dsv4ops.simulate_platform("cuda", "sm100"):
        assert prefs(1, 2048) == {}


def test_preferences_apply_on_the_device_they_were_measured_on():
    """A preference measured on the H100 does not carry over to the H200 (same sm90): there DeepGEMM's
    paged logits stay first at 8K (Triton 0.89x, measured) and Triton's win only at 1K (1.94x); an
    sm90 device no row names gets the general priorities."""
    from dsv4ops.conformance.cases import make_case
    from dsv4ops.ops import OPS
    from dsv4ops.priorities import preferred

    def prefs(op, **params):
        kw = make_case(op, **params).build("cpu", 0)
        return preferred(op, dsv4ops.platform(), OPS[op].validate_call(**kw).key)

    logits = functools.partial(prefs, "paged_mqa_logits", B=2, next_n=1)
    decode = functools.partial(prefs, "sparse_mla_decode", T=8, H=16, topk=32, layout="fp8_ds_mla")
    with dsv4ops.simulate_platform("cuda", "sm90", H100):
        assert dsv4ops.platform().model == "H100" and logits(context=8192) == {"triton": "deepgemm"}
    with dsv4ops.simulate_platform("cuda", "sm90", "NVIDIA H200"):
        assert logits(context=8192) == {} and logits(context=2048) == {}
        assert logits(context=1024) == {"triton": "deepgemm"}
        assert decode() == {}
    for unnamed in ("NVIDIA H800", None):                     # None: "simulated cuda sm90", no model
        with dsv4ops.simulate_platform("cuda", "sm90", unnamed):
            assert logits(context=1024) == logits(context=8192) == decode() == {}


@pytest.mark.parametrize("cc,arch", [((9, 0), "sm90"), ((10, 0), "sm100"), ((10, 3), "sm103"), ((12, 0), "sm120"),
                                     ((12, 1), "sm121")])
def test_cuda_arch_tags(cc, arch):
    from dsv4ops.platform import cuda_arch
    assert cuda_arch(*cc) == arch


def test_rocm_arch_tags():
    from dsv4ops.platform import rocm_arch
    assert rocm_arch("gfx942:sramecc+:xnack-") == "gfx942" and rocm_arch("gfx950") == "gfx950"


def test_sm_major():
    from dsv4ops.backend_support import sm_major
    assert [sm_major(a) for a in ("sm90", "sm100", "sm121", "gfx942")] == [9, 10, 12, 0]


@pytest.mark.parametrize("value,why", [("decode_block_h=0", "power of two, at least 16"),
                                       ("decode_block_k=24", "power of two"), ("topk_warps=64", "1 to 32"),
                                       ("decode_stages=0", "at least 1"), ("nope=4", "bad entry"),
                                       ("topk_resident=65536", "from 1 to 32768"),
                                       ("decode_block_h=", "bad entry"), ("einsum_tma=2", "einsum_tma=2 must be 0 or 1")])
def test_bad_triton_tuning_is_config_error(env, value, why):
    from dsv4ops.backends.triton.tuning import tuning
    env(DSV4OPS_TRITON_TUNING=value)
    with pytest.raises(dsv4ops.ConfigError, match=why):
        tuning(dsv4ops.platform("cpu"))
    env(DSV4OPS_TRITON_TUNING="decode_block_h=32,topk_warps=4,einsum_tma=1")
    tune = tuning(dsv4ops.platform("cpu"))
    assert (tune.decode_block_h, tune.einsum_tma) == (32, 1)


@pytest.mark.parametrize("plat,why", [("cpu", "Triton's interpreter runs the fp8 types as they are"),
                                      ("cuda:sm90", "cuda:sm90 has FP8 tensor cores")])
def test_fp8_path_reason_names_what_the_platform_has(plat, why):
    """explain says why the software fp8 path declines: FP8 tensor cores on a GPU, never on a CPU."""
    from dsv4ops.conformance import typical_case
    kwargs = typical_case("sparse_mla_decode").build("cpu", seed=0)
    with (dsv4ops.simulate_platform(*plat.split(":")) if ":" in plat else contextlib.nullcontext()):
        text = str(dsv4ops.explain("sparse_mla_decode", **kwargs))
    assert why in text and ("tensor cores" not in text) == (plat == "cpu")


@pytest.mark.parametrize("op", dsv4ops.OP_NAMES)
@pytest.mark.parametrize("value", ["decode_block_h=0", "decode_block_k=24", "nope=4", "topk_block=-1"])
def test_bad_triton_tuning_raises_for_every_op(env, op, value):
    """A malformed DSV4OPS_TRITON_TUNING is the user's error on every op, also where the Triton
    backend's capability check reads the tuning: never a decline that lets another backend run."""
    from dsv4ops.conformance import typical_case
    env(DSV4OPS_TRITON_TUNING=value)
    kwargs = typical_case(op).build("cpu", seed=0)
    with pytest.raises(dsv4ops.ConfigError, match="DSV4OPS_TRITON_TUNING"):
        dsv4ops.dispatch(op, **kwargs)
    with pytest.raises(dsv4ops.ConfigError, match="DSV4OPS_TRITON_TUNING"):
        dsv4ops.dispatch(op, **kwargs, backend="triton")


@pytest.mark.parametrize("vendor,arch,lanes,warps", [("cuda", "sm90", 32, 32), ("rocm", "gfx942", 64, 16),
                                                       ("rocm", "gfx1100", 32, 32)])
def test_resident_topk_programs_stay_within_1024_threads(vendor, arch, lanes, warps):
    """The top-k's resident programs take their warps from the block size; a warp of a CDNA GPU
    has 64 lanes, so the default 32768-key block gets 16 warps there, 32 elsewhere."""
    from dsv4ops.backends.triton.kth import resident_warps
    from dsv4ops.backends.triton.tuning import warp_lanes

    from dsv4ops.platform import Platform
    assert warp_lanes(Platform(vendor, arch, "test GPU")) == lanes
    assert resident_warps(32768, 32, lanes) == warps
    assert resident_warps(65536, 16, lanes) * lanes == 1024
    assert resident_warps(256, 32, lanes) == 4


def test_triton_tuning_warps_are_limited_by_the_gpus_warp_width(env):
    from dsv4ops.backends.triton.tuning import tuning

    from dsv4ops.platform import Platform
    cdna, hopper = Platform("rocm", "gfx942", "test GPU"), Platform("cuda", "sm90", "test GPU")
    env(DSV4OPS_TRITON_TUNING="topk_warps=32")
    assert tuning(hopper).topk_warps == 32
    with pytest.raises(dsv4ops.ConfigError, match="topk_warps=32 must be a power of two from 1 to 16"):
        tuning(cdna)
    env(DSV4OPS_TRITON_TUNING="topk_warps=16")
    assert tuning(cdna).topk_warps == 16


@pytest.mark.parametrize("plat,pdl", [("cuda:sm80", False), ("cuda:sm89", False), ("cuda:sm90", True),
                                      ("cuda:sm120", True), ("rocm:gfx942", False)])
def test_programmatic_dependent_launch_only_where_the_gpu_has_it(plat, pdl, env):
    """``Target.pdl`` on CUDA sm90+ only (``griddepcontrol``), never in the interpreter; the tunable
    ``pdl=0`` turns it off, and it takes 0 or 1."""
    from dsv4ops.backends.triton.tuning import target, tuning

    assert not target(dsv4ops.platform("cpu")).pdl
    with dsv4ops.simulate_platform(*plat.split(":")) as p:
        assert target(p).pdl is pdl
        env(DSV4OPS_TRITON_TUNING="pdl=0")
        assert target(p).pdl is False
        env(DSV4OPS_TRITON_TUNING="pdl=2")
        with pytest.raises(dsv4ops.ConfigError, match="pdl=2 must be 0 or 1"):
            tuning(p)


# ---------------------------------------------------------------------------------------------
# Measured dispatch (dsv4ops tune's selection table)

def _table(tmp_path, entries, device=None):
    from dsv4ops import tuning_table
    plat = dsv4ops.platform("cpu")
    if device is not None:
        import dataclasses
        plat = dataclasses.replace(plat, device_name=device)
    path = tmp_path / "tuning.json"
    tuning_table.save(str(path), plat, entries)
    return str(path)


def _entry(choice, size_class=None, **kw):
    from dsv4ops import tuning_table
    from dsv4ops.ops import OPS
    key = OPS["indexer_topk"].validate_call(**kw).key
    return dict(op="indexer_topk", bucket=tuning_table.bucket(key), choice=choice,
                size_class=key.size_class if size_class is None else size_class)


def test_tuning_table_choice_beats_priority(env, fakes, tmp_path):
    kw = topk_args()
    env(DSV4OPS_TUNING_TABLE=_table(tmp_path, [_entry("slow", **kw)]))
    dsv4ops.indexer_topk(**kw)
    assert fakes == ["slow"]                                      # measured fastest, over 'fast' (priority 90)
    d = dsv4ops.explain("indexer_topk", **kw)
    assert d.backend == "slow" and d.source.startswith("tuning table")
    dsv4ops.indexer_topk(**kw, backend="fast")                    # backend= still wins
    assert fakes[-1] == "fast"
    other = {**kw, "k": 4}                                        # another bucket: priorities as before
    dsv4ops.indexer_topk(**other)
    assert fakes[-1] == "fast" and dsv4ops.explain("indexer_topk", **other).source == "priority"


def test_tuning_table_choice_that_declines_falls_back(env, fakes, tmp_path):
    kw = {**topk_args(), "k": 32}                                 # 'fast' declines k > 16
    env(DSV4OPS_TUNING_TABLE=_table(tmp_path, [_entry("fast", **kw)]))
    dsv4ops.indexer_topk(**kw)
    assert fakes == ["slow"]


def test_tuning_table_takes_the_nearest_measured_size_class(env, fakes, tmp_path):
    kw = topk_args()                                              # 4 rows: size class 3
    env(DSV4OPS_TUNING_TABLE=_table(tmp_path, [_entry("slow", size_class=5, **kw),
                                               _entry("fast", size_class=9, **kw)]))
    dsv4ops.indexer_topk(**kw)
    assert fakes == ["slow"]                                      # 5 is nearer to 3 than 9


def test_stale_tuning_table_is_ignored_with_a_warning(env, fakes, tmp_path):
    kw = topk_args()
    env(DSV4OPS_TUNING_TABLE=_table(tmp_path, [_entry("slow", **kw)], device="another GPU"))
    with pytest.warns(UserWarning, match="measured on another GPU"):
        dsv4ops.indexer_topk(**kw)
    assert fakes == ["fast"]


def test_unreadable_tuning_table_is_config_error(env, tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text("{}")
    for path in (str(bad), str(tmp_path / "missing.json")):
        env(DSV4OPS_TUNING_TABLE=path)
        with pytest.raises(dsv4ops.ConfigError, match="DSV4OPS_TUNING_TABLE"):
            dsv4ops.indexer_topk(**topk_args())


def test_tune_entries_keep_the_most_frequent_winner():
    from dsv4ops.bench import Timing
    from dsv4ops.conformance.cases import make_case
    from dsv4ops.tune import entries_from
    cases = [make_case("indexer_topk", R=4, W=64, k=8, mode="ranges", data=d) for d in ("random", "ties", "neg_inf")]
    rows = [Timing("indexer_topk", cases[0].id, "a", us=1.0), Timing("indexer_topk", cases[0].id, "b", us=2.0),
            Timing("indexer_topk", cases[1].id, "a", us=3.0), Timing("indexer_topk", cases[1].id, "b", us=2.0),
            Timing("indexer_topk", cases[2].id, "b", us=1.0), Timing("indexer_topk", cases[2].id, "a", note="skipped")]
    (entry,) = entries_from(cases, rows, "cpu")                  # one bucket: same shapes and arguments
    assert entry["op"] == "indexer_topk" and entry["choice"] == "b"


def test_tune_from_a_bench_result_of_this_machine_only():
    """``tune --from-bench``: the bench's timings give the table (fastest per bucket); a result
    measured on another device or with other library versions is refused, naming both."""
    from dataclasses import asdict

    from dsv4ops.bench import Timing, step_cases
    from dsv4ops.errors import ConfigError
    from dsv4ops.platform import platform
    from dsv4ops.tune import entries_from, from_bench

    plat = platform(torch.device("cpu"))
    case = next(c for c in step_cases() if c.op == "indexer_topk")
    rows = [Timing(case.op, case.id, "triton", us=9.0), Timing(case.op, case.id, "flashinfer", us=7.0),
            Timing(case.op, case.id, "deepselect", note="skipped: arch")]
    data = dict(platform=str(plat), libraries=dict(plat.libraries), shapes=["step"], results=[asdict(r) for r in rows])
    cases, timings = from_bench(data, plat)
    assert [c.id for c in cases] == [case.id]
    entry, = entries_from(cases, timings, "cpu")
    assert entry["choice"] == "flashinfer" and entry["timings_us"] == {"triton": 9.0, "flashinfer": 7.0}
    with pytest.raises(ConfigError, match="not here"):
        from_bench({**data, "platform": "cuda:sm90 [NVIDIA H100 80GB HBM3]"}, plat)
    with pytest.raises(ConfigError, match="not here"):
        from_bench({**data, "libraries": {**data["libraries"], "torch": "0.0"}}, plat)
