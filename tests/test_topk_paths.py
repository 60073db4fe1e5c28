"""The two ways the Triton indexer_topk finds the k-th largest key of a resident selection: a floor
from a strided sample, then the bisection of the at most ``topk_cap`` keys above it (compacted into
scratch slots), or, when the floor brackets fewer than k or more than the cap (ties, equal logits,
an unlucky sample), the bisection of every key. Both must give the exact top-k of the key order
(+NaN above +inf, -NaN below -inf; ties by column), in stage 1 and in the gathering stage 2.

Which way a program went is read from its scratch slots (created zeroed by the spy below): the
sampled way writes its candidates there (a nonzero key first), the fallback writes nothing."""
import pytest
import torch

import dsv4ops

TRITON = any(b.name == "triton" and b.available for b in dsv4ops.backends())
pytestmark = pytest.mark.skipif(not TRITON, reason="the Triton backend is not available here")

CAP = 128
TUNING = f"topk_resident=512,topk_cap={CAP},topk_sample=128,topk_min_piece=64"
W = 512


def sort_key(logits):
    """int64 keys in the kernel's order (its fp32 -> uint32 ``_sort_key``)."""
    bits = logits.contiguous().view(torch.int32).to(torch.int64) & 0xFFFFFFFF
    return torch.where(bits >= 2 ** 31, bits ^ 0xFFFFFFFF, bits | 0x80000000)


def assert_exact(got, logits, k, starts, ends):
    """Each row: the columns of the min(k, n) largest keys in [start, end) (ties by lower column),
    row-local, in any order, then -1."""
    keys = sort_key(logits)
    for r in range(logits.shape[0]):
        s, e = int(starts[r]), int(ends[r])
        cols = torch.arange(s, e)
        order = sorted(cols.tolist(), key=lambda c: (-int(keys[r, c]), c))[:k]
        m = len(order)
        assert sorted(got[r, :m].tolist()) == sorted(c - s for c in order), f"row {r}"
        assert (got[r, m:] == -1).all(), f"row {r}: not -1 after {m} entries"


@pytest.fixture
def scratch(monkeypatch):
    """The scratch buffers of the launches (one per launch, zeroed), as [programs, CAP] views."""
    from dsv4ops.backends.triton import indexer_topk as module
    made = []

    def zeroed(n, device):
        buf = torch.zeros(max(n, 1), dtype=torch.int32, device=device)
        made.append(buf)
        return buf
    monkeypatch.setattr(module, "_scratch", zeroed)
    return lambda: [b.view(-1, CAP) for b in made if b.numel() > 1]


def sampled_programs(buf):
    return int((buf[:, 0] != 0).sum())


def run(env, logits, k, *, starts=None, ends=None, lens=None, next_n=1, tuning=TUNING):
    env(DSV4OPS_TRITON_TUNING=tuning)
    R = logits.shape[0]
    out = torch.full((R, k), 7777, dtype=torch.int32)           # poison
    if lens is None:
        got = dsv4ops.indexer_topk(logits, k, row_starts=starts.to(torch.int32), row_ends=ends.to(torch.int32),
                                   out=out, backend="triton")
    else:
        got = dsv4ops.indexer_topk(logits, k, seq_lens=lens.to(torch.int32), next_n=next_n, out=out,
                                   backend="triton")
    assert got.data_ptr() == out.data_ptr()
    return got


def special_values(gen, logits):
    """+inf, -inf, +NaN, -NaN and the all-ones NaN (key 0, as dead positions) sprinkled over ``logits``."""
    u = torch.rand(logits.shape, generator=gen)
    logits[u < 0.05] = float("inf")
    logits[(u >= 0.05) & (u < 0.15)] = float("-inf")
    logits[(u >= 0.15) & (u < 0.18)] = float("nan")
    bits = logits.view(torch.int32)
    bits[(u >= 0.18) & (u < 0.2)] = torch.tensor(0xFFC00000 - 2 ** 32, dtype=torch.int32)     # -NaN
    bits[(u >= 0.2) & (u < 0.21)] = -1                                                          # 0xFFFFFFFF
    return logits


@pytest.mark.parametrize("mode", ["ranges", "decode1d", "decode2d"])
@pytest.mark.parametrize("k", [1, 16, 40])
@pytest.mark.parametrize("bits", [32, 8])
def test_sampled_path_is_exact_on_random_rows(env, scratch, mode, k, bits):
    """``bits``: the sample's bisection finds the floor's top bits only (a lower floor)."""
    gen = torch.Generator().manual_seed(k + len(mode))
    tuning = f"{TUNING},topk_sample_bits={bits}"
    R, next_n = 16, 2
    logits = torch.randn(R, W, generator=gen)
    lens = torch.randint(CAP + 1, W + 1, (R // next_n,), generator=gen)
    lens[0] = W
    if mode == "ranges":
        starts = torch.randint(0, W // 8, (R,), generator=gen)
        ends = torch.maximum(starts, torch.randint(W // 2, W + 1, (R,), generator=gen))
        ends[0] = W
        got = run(env, logits, k, starts=starts, ends=ends, tuning=tuning)
    elif mode == "decode1d":
        starts = torch.zeros(R, dtype=torch.int64)
        ends = (lens.repeat_interleave(next_n) - next_n + torch.arange(R) % next_n + 1).clamp_min(0)
        got = run(env, logits, k, lens=lens, next_n=next_n, tuning=tuning)
    else:
        lens2 = torch.randint(0, W + 1, (R // next_n, next_n), generator=gen)
        lens2[0, 0] = W
        starts, ends = torch.zeros(R, dtype=torch.int64), lens2.reshape(-1)
        got = run(env, logits, k, lens=lens2, next_n=next_n, tuning=tuning)
    assert_exact(got, logits, k, starts, ends)
    (buf,) = scratch()
    long_rows = int(((ends - starts) > 0).sum())
    assert sampled_programs(buf) >= long_rows / 2, "the sample should bracket most random rows"


@pytest.mark.parametrize("data", ["special", "short", "empty"])
def test_sampled_path_corners(env, scratch, data):
    """NaN / +-inf; rows shorter than k (the floor takes every live key); empty rows (want 0)."""
    gen = torch.Generator().manual_seed(3)
    R, k = 8, 48
    logits = torch.randn(R, W, generator=gen)
    starts = torch.randint(0, 64, (R,), generator=gen)
    ends = starts + torch.randint(CAP + 1, W - 64, (R,), generator=gen)
    if data == "special":
        special_values(gen, logits)
    elif data == "short":
        ends = starts + torch.tensor([0, 1, 5, 20, 47, 48, 49, 100])
        logits[:, 1::7] = float("nan")
    else:
        ends[::2] = starts[::2]
    logits[:, :3] = float("inf")                # outside most ranges: never returned
    got = run(env, logits, k, starts=starts, ends=ends)
    assert_exact(got, logits, k, starts, ends)
    if data == "empty":
        assert (got[::2] == -1).all()
    (buf,) = scratch()
    assert sampled_programs(buf) > 0


def adversarial(kind, gen):
    """Full rows whose strided sample (every 4th column: W / topk_sample) misleads the floor:
    ``high``: the sampled columns hold the largest logits, so too few keys reach the floor;
    ``low``: they hold the smallest, so too many do. ``equal`` / ``ties``: equal logits, more than
    the cap of them at the k-th value."""
    logits = torch.randn(4, W, generator=gen)
    if kind == "high":
        logits[:, ::4] = 100 + torch.rand(4, W // 4, generator=gen)
    elif kind == "low":
        logits[:, ::4] = -100 - torch.rand(4, W // 4, generator=gen)
    elif kind == "equal":
        logits[:] = 0.25
    else:
        logits = torch.randint(0, 3, (4, W), generator=gen).to(torch.float32)
    return logits


@pytest.mark.parametrize("kind", ["high", "low", "equal", "ties"])
def test_fallback_is_exact_where_the_floor_misses(env, scratch, kind):
    gen = torch.Generator().manual_seed(11)
    logits, k = adversarial(kind, gen), 32
    starts, ends = torch.zeros(4, dtype=torch.int64), torch.full((4,), W)
    got = run(env, logits, k, starts=starts, ends=ends)
    assert_exact(got, logits, k, starts, ends)
    (buf,) = scratch()
    assert sampled_programs(buf) == 0, "every program should have fallen back to the full bisection"


@pytest.mark.parametrize("data", ["random", "special", "equal"])
def test_gathering_stage_two(env, scratch, data):
    """Two rows (fewer than the interpreter's 4 'multiprocessors') of 2048 columns: 4 pieces of 512
    (stage 1), then 4k = 192 candidates per row (stage 2, a 256 block above the cap of 128)."""
    gen = torch.Generator().manual_seed(5)
    R, k, width = 2, 48, 2048
    logits = torch.randn(R, width, generator=gen)
    if data == "special":
        special_values(gen, logits)
    elif data == "equal":
        logits[:] = -3.5
    starts, ends = torch.tensor([0, 100]), torch.tensor([width, width - 7])
    got = run(env, logits, k, starts=starts, ends=ends)
    assert_exact(got, logits, k, starts, ends)
    stage1, stage2 = scratch()
    assert stage1.shape[0] == R * 4 and stage2.shape[0] == R
    if data == "equal":
        assert sampled_programs(stage1) == 0 and sampled_programs(stage2) == 0
    elif data == "random":
        assert sampled_programs(stage2) == R and sampled_programs(stage1) >= R * 2
