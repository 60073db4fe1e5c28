"""What several test files share: the backends the CPU suite runs, a fixed generator, the
"raises InputError and writes nothing" assertion, and the model's own compressor formulation.

Importable as ``helpers`` from every test folder: tests/ has no ``__init__.py``, so pytest puts the
folder of the root conftest (tests/) on ``sys.path``."""
import pytest
import torch
from dsv4ops.reference.impl.rope import rotate

import dsv4ops
from dsv4ops import formats

TRITON = any(b.name == "triton" and b.available for b in dsv4ops.backends())
needs_triton = pytest.mark.skipif(not TRITON, reason="the Triton backend is not available here")
BACKENDS = [b.name for b in dsv4ops.backends() if b.available and b.name in ("reference", "triton")]

BAD_SCALES = [float("nan"), float("inf"), 0.0, -0.5]       # values a scale argument must refuse


def G(seed: int = 7) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def bf16(x: float) -> float:
    """``x`` rounded to bfloat16."""
    return torch.tensor(x, dtype=torch.float32).to(torch.bfloat16).item()


def raises_input_error(op: str, kw: dict, arg: str, match: str | None = None) -> None:
    """``op(**kw)`` raises an InputError naming ``arg`` on the reference and the Triton backend, and
    writes nothing."""
    before = {k: v.clone() for k, v in kw.items() if isinstance(v, torch.Tensor)}
    pattern = f"{op}: argument '{arg}'" + (f".*{match}" if match else "")
    for backend in ("reference", "triton"):
        with pytest.raises(dsv4ops.InputError, match=pattern):
            getattr(dsv4ops, op)(**kw, backend=backend)
    for name, t in before.items():
        assert torch.equal(kw[name].contiguous().view(torch.uint8), t.contiguous().view(torch.uint8)), name


def model_entries(kv, score, ape, weight, eps, ratio, cs):
    """The compressed entries (bf16-valued fp32 [L // ratio, D]) the way the model computes them for a
    whole prompt: windows of ``ratio`` tokens pooled at once (for ratio 4 overlapped with the previous
    window through the first half of the projections), RMSNorm, RoPE at each window's first position."""
    c = formats.window_overlap(ratio)
    D = kv.shape[1] // c
    n = kv.shape[0] // ratio
    kv = kv[: n * ratio].view(n, ratio, c * D)
    score = score[: n * ratio].view(n, ratio, c * D) + ape
    if c == 2:                                  # window i = previous window's tokens (dims [0, D)) + its own ([D, 2D))
        kv2 = kv.new_zeros(n, 2 * ratio, D)
        sc2 = score.new_full((n, 2 * ratio, D), float("-inf"))
        kv2[:, ratio:], sc2[:, ratio:] = kv[:, :, D:], score[:, :, D:]
        kv2[1:, :ratio], sc2[1:, :ratio] = kv[:-1, :, :D], score[:-1, :, :D]
        kv, score = kv2, sc2
    pooled = (kv * score.softmax(dim=1)).sum(dim=1)
    normed = pooled * torch.rsqrt(pooled.square().mean(-1, keepdim=True) + eps) * weight
    rows = cs[torch.arange(n) * ratio]
    return rotate(normed, rows[:, :32], rows[:, 32:]).to(torch.bfloat16).float()


def assert_restricted_topk(want, positions, starts, k, slack):
    """``positions`` (int [R, k], relative to ``starts``, -1 padded) is a top-k of the candidate
    columns of ``want`` (fp32 [R, W], -inf outside the candidates): min(k, candidates) distinct
    candidates first, then -1, and no unselected candidate above a selected one by more than their
    two ``slack`` values (the logits' error bounds)."""
    for r in range(want.shape[0]):
        candidates = torch.nonzero(want[r] > float("-inf")).flatten()
        m = min(k, candidates.numel())
        row = positions[r].long()
        assert bool((row[:m] >= 0).all()) and bool((row[m:] == -1).all()), (r, row.tolist(), m)
        got = row[:m] + int(starts[r])
        assert got.unique().numel() == m and bool(torch.isin(got, candidates).all()), r
        others = candidates[~torch.isin(candidates, got)]
        if m and others.numel():
            low = (want[r, got] + slack[r, got]).min()
            high = (want[r, others] - slack[r, others]).max()
            assert low >= high, (r, float(low), float(high))


def allocation_sizes(monkeypatch, call) -> list[int]:
    """The bytes of every ``torch.empty`` made while ``call()`` runs."""
    sizes, empty = [], torch.empty

    def watch(*shape, **kwargs):
        t = empty(*shape, **kwargs)
        sizes.append(t.numel() * t.element_size())
        return t

    monkeypatch.setattr(torch, "empty", watch)
    call()
    return sizes
