"""Device rules: every tensor of a call on one device (InputError naming the one that is not), and
every implementation runs on its tensors' device whatever the current device is (GPU test)."""
import pytest
import torch

import dsv4ops
from dsv4ops import OP_NAMES, selection, tensor_guard
from dsv4ops.conformance import run_case, run_matrix, select_cases, typical_case
from dsv4ops.ops import OPS


def _tensor_args(op):
    kw = typical_case(op).build("cpu", seed=0)
    return kw, [name for name, v in kw.items() if isinstance(v, torch.Tensor)]


@pytest.mark.parametrize("op", OP_NAMES)
def test_tensor_on_another_device_is_named(op):
    kw, names = _tensor_args(op)
    anchor = names[0]
    for name in names[1:]:
        moved = dict(kw, **{name: kw[name].to("meta")})
        with pytest.raises(dsv4ops.InputError, match=f"argument '{name}' must be on cpu like the other inputs"):
            dsv4ops.dispatch(op, **moved)
    odd_one_out = f"argument '{anchor}' must be on cpu" if len(names) > 2 else "must be on meta"  # 2: a tie
    with pytest.raises(dsv4ops.InputError, match=f"{odd_one_out} like the other inputs"):
        dsv4ops.dispatch(op, **dict(kw, **{anchor: kw[anchor].to("meta")}))


needs_two_gpus = pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two CUDA devices")


@pytest.mark.gpu
@needs_two_gpus
@pytest.mark.parametrize("current,target", [(0, 1), (1, 0)])
def test_quick_tier_on_a_device_that_is_not_current(current, target):
    names = [b.name for b in dsv4ops.backends() if b.available]
    with torch.cuda.device(current):
        results = run_matrix(select_cases(OP_NAMES, "quick"), names, torch.device("cuda", target))
        assert torch.cuda.current_device() == current
    ran = [r for r in results if r.status != "skip"]
    bad = [f"{r.backend} {r.case.id}: {r.message}" for r in ran if r.status != "pass"]
    assert ran and not bad, "\n".join(bad)


@pytest.mark.gpu
@needs_two_gpus
@pytest.mark.parametrize("op", OP_NAMES)
def test_repeated_calls_on_alternating_devices(op, validations):
    """After its first call a structure skips validation (the compiled guard, else the structure key):
    the same case on cuda:1, again, then on cuda:0 and back, with cuda:0 current, every call judged
    against the reference; the device index keeps the structures apart."""
    validated = validations(op)
    selection.clear_cache()
    targets = (1, 1, 0, 0, 1)
    with torch.cuda.device(0):
        for target in targets:
            result = run_case(typical_case(op), None, torch.device("cuda", target), seed=target)
            assert result.status == "pass", f"cuda:{target}: {result.message}"
    # run_case validates once per call to choose; the calls themselves only per new structure:
    # (auto, reference) x (cuda:1, cuda:0)
    assert len(validated) == len(targets) + 4
    assert len(selection.recent_structures(op)) == (4 if tensor_guard.AVAILABLE else 0)


@pytest.mark.parametrize("op", OP_NAMES)
def test_meta_tensors_give_shape_only_outputs(op):
    """Meta tensors (shape inference, FakeTensor-style tracing) get the op's fake outputs: the
    shapes and dtypes a real call returns, with no backend involved; prepare() refuses them."""
    from dsv4ops.conformance import make_case
    kw = make_case(op, "quick", **OPS[op].spec.bench.tiny).build("cpu", seed=0)
    real = dsv4ops.dispatch(op, **kw, backend="reference")
    meta = dsv4ops.dispatch(op, **{k: v.to("meta") if isinstance(v, torch.Tensor) else v for k, v in kw.items()})
    flat = lambda r: [r] if not isinstance(r, tuple) else list(r)
    for got, want in zip(flat(meta), flat(real)):
        assert (got is None) == (want is None)
        if want is not None:
            assert got.device.type == "meta" and got.shape == want.shape and got.dtype == want.dtype
    with pytest.raises(dsv4ops.InputError, match="meta tensors"):
        dsv4ops.prepare(op, **{k: v.to("meta") if isinstance(v, torch.Tensor) else v for k, v in kw.items()})
