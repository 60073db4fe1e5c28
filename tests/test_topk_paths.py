"""The ways the Triton indexer_topk finds the k-th largest key: a floor from a strided sample, then
the bisection of the at most ``topk_cap`` keys at or above it (stashed in scratch slots), or, when
the floor brackets fewer than k or more than the cap (ties, equal logits, an unlucky sample), the
search over every key (the bisection of a resident block, the histogram passes of a streamed one).
Each must give the exact top-k of the key order (+NaN above +inf, -NaN below -inf; ties by column),
in stage 1 (resident or streamed) and in the gathering stage 2.

Which way a program went is read from the bisections it ran (a spy on ``_kth_largest``, which the
interpreter calls as a Python function): one of a ``[CAP]`` block is the sampled way."""
import pytest
import torch

import dsv4ops

TRITON = any(b.name == "triton" and b.available for b in dsv4ops.backends())
pytestmark = pytest.mark.skipif(not TRITON, reason="the Triton backend is not available here")

CAP, W = 128, 512
SAMPLES = f"topk_cap={CAP},topk_sample=256,topk_min_piece=64"
LAYOUTS = {"resident": f"topk_resident=512,topk_max_piece=512,{SAMPLES}",          # one 512 block
           "streamed": f"topk_resident=64,topk_max_piece=1024,topk_block=64,{SAMPLES}"}   # 8 blocks of 64
TUNING = LAYOUTS["resident"]


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
def launches(monkeypatch):
    """The launches so far, each the list of the key-block sizes its programs bisected."""
    from dsv4ops.backends.triton import indexer_topk as module
    made = []
    launch, kth_largest = module._launch, module._kth_largest

    def counted_launch(*args, **kwargs):
        made.append([])
        return launch(*args, **kwargs)

    def spied_kth_largest(key, *args):
        made[-1].append(key.shape[0])
        return kth_largest(key, *args)
    monkeypatch.setattr(module, "_launch", counted_launch)
    monkeypatch.setattr(module, "_kth_largest", spied_kth_largest)
    return made


def sampled_programs(launch):
    """Programs of a launch that bisected their stashed keys (one ``[CAP]`` block each)."""
    return launch.count(CAP)


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


@pytest.mark.parametrize("layout", ["resident", "streamed"])
@pytest.mark.parametrize("mode", ["ranges", "decode1d", "decode2d"])
@pytest.mark.parametrize("k", [1, 16, 40])
@pytest.mark.parametrize("bits", [32, 12])
def test_sampled_path_is_exact_on_random_rows(env, launches, layout, mode, k, bits):
    """``bits``: the sample's bisection finds the floor's top bits only (a lower floor)."""
    gen = torch.Generator().manual_seed(k + len(mode))
    tuning = f"{LAYOUTS[layout]},topk_sample_bits={bits}"
    R, next_n = 16, 2
    logits = torch.randn(R, W, generator=gen)
    if mode == "ranges":
        starts = torch.randint(0, W // 8, (R,), generator=gen)
        ends = torch.maximum(starts, torch.randint(W // 2, W + 1, (R,), generator=gen))
        ends[0] = W
        got = run(env, logits, k, starts=starts, ends=ends, tuning=tuning)
    elif mode == "decode1d":
        lens = torch.randint(CAP + 1, W + 1, (R // next_n,), generator=gen)
        lens[0] = W
        starts = torch.zeros(R, dtype=torch.int64)
        ends = (lens.repeat_interleave(next_n) - next_n + torch.arange(R) % next_n + 1).clamp_min(0)
        got = run(env, logits, k, lens=lens, next_n=next_n, tuning=tuning)
    else:
        lens2 = torch.randint(0, W + 1, (R // next_n, next_n), generator=gen)
        lens2[0, 0] = W
        starts, ends = torch.zeros(R, dtype=torch.int64), lens2.reshape(-1)
        got = run(env, logits, k, lens=lens2, next_n=next_n, tuning=tuning)
    assert_exact(got, logits, k, starts, ends)
    (launch,) = launches
    assert sampled_programs(launch) >= 3 * R // 4, "the sample should bracket most random rows"


@pytest.mark.parametrize("layout", ["resident", "streamed"])
@pytest.mark.parametrize("data", ["special", "short", "empty"])
def test_sampled_path_corners(env, launches, layout, data):
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
    got = run(env, logits, k, starts=starts, ends=ends, tuning=LAYOUTS[layout])
    assert_exact(got, logits, k, starts, ends)
    if data == "empty":
        assert (got[::2] == -1).all()
    (launch,) = launches
    assert sampled_programs(launch) >= (R if data == "short" else R // 2)


def adversarial(kind, gen):
    """Full rows whose strided sample (every 2nd column: W / topk_sample) misleads the floor:
    ``high``: the sampled columns hold the largest logits, so fewer than k keys reach the floor;
    ``low``: they hold the smallest, so more than the cap do. ``equal`` / ``ties``: equal logits,
    more than the cap of them at the k-th value."""
    logits = torch.randn(4, W, generator=gen)
    if kind == "high":
        logits[:, ::2] = 100 + torch.rand(4, W // 2, generator=gen)
    elif kind == "low":
        logits[:, ::2] = -100 - torch.rand(4, W // 2, generator=gen)
    elif kind == "equal":
        logits[:] = 0.25
    else:
        logits = torch.randint(0, 3, (4, W), generator=gen).to(torch.float32)
    return logits


@pytest.mark.parametrize("layout", ["resident", "streamed"])
@pytest.mark.parametrize("kind", ["high", "low", "equal", "ties"])
def test_fallback_is_exact_where_the_floor_misses(env, launches, layout, kind):
    gen = torch.Generator().manual_seed(11)
    logits, k = adversarial(kind, gen), 48
    starts, ends = torch.zeros(4, dtype=torch.int64), torch.full((4,), W)
    got = run(env, logits, k, starts=starts, ends=ends, tuning=LAYOUTS[layout])
    assert_exact(got, logits, k, starts, ends)
    (launch,) = launches
    assert sampled_programs(launch) == 0, "every program should have fallen back to the search over all keys"
    if layout == "resident":
        assert launch.count(W) == 4, "the fallback bisects the whole block"


@pytest.mark.parametrize("data", ["random", "special", "equal"])
def test_gathering_stage_two(env, launches, data):
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
    stage1, stage2 = launches
    if data == "equal":
        assert sampled_programs(stage1) == 0 and sampled_programs(stage2) == 0
    elif data == "random":
        assert sampled_programs(stage1) >= R * 3 and sampled_programs(stage2) == R
