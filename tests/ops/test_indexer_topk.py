"""indexer_topk's own tests. Its error inputs are declared in its spec (test_errors.py), its layouts
and aliases generated (test_strides.py).

The Triton top-k's resident search (``kth_largest``) on whole rows held by one program, for logit
distributions that stress an interpolated search: heavy tails spanning many binades, bf16-rounded
values (long runs of equal keys), few distinct values, ``-inf`` padding, and ``k`` equal to the
number of valid columns: through the op against the reference (conformance comparison), and the
search alone against the property its threshold must have."""
import numpy as np
import pytest
import torch
from helpers import TRITON, G, needs_triton, raises_input_error

import dsv4ops
from dsv4ops.conformance import build_inputs, run_case
from dsv4ops.conformance.cases import make_case

if TRITON:
    import triton
    import triton.language as tl
    from dsv4ops.backends.triton.kth import kth_largest_within

    @triton.jit
    def _search(keys_ptr, k_ptr, slack_ptr, out_ptr, BLOCK: tl.constexpr):
        """Row r of ``keys`` int64 [R, BLOCK] (uint32 keys, 0 dead) -> out[r] = (threshold, want)."""
        row = tl.program_id(0)
        key = tl.load(keys_ptr + row * BLOCK + tl.arange(0, BLOCK)).to(tl.uint32)
        threshold, want = kth_largest_within(key, tl.load(k_ptr + row), tl.load(slack_ptr + row))
        tl.store(out_ptr + row * 2, threshold.to(tl.int64))
        tl.store(out_ptr + row * 2 + 1, want.to(tl.int64))


# --- the Triton resident search --------------------------------------------------------------

@needs_triton
@pytest.mark.parametrize("data", ["random", "heavy_tail", "bf16", "ties", "neg_inf"])
@pytest.mark.parametrize("W,k", [(2048, 64), (1024, 512), (700, 1024)], ids=["2048-64", "1024-512", "k>W"])
def test_resident_rows_match_the_reference(env, data, W, k):
    """One resident program per row (``topk_resident`` = W rounded up), so the search runs over the
    whole row; rows of random length, some empty."""
    env(DSV4OPS_TRITON_TUNING="topk_resident=2048,topk_min_piece=4096")      # no split
    case = make_case("indexer_topk", R=3, W=W, k=k, mode="ranges", data=data, corner="empty")
    result = run_case(case, "triton", "cpu", seed=5)
    assert result.status == "pass", f"{result.message}\nrerun: {result.reproducer()}"


def _sort_keys(x: np.ndarray) -> np.ndarray:
    """float32 -> the kernel's order-preserving uint32 keys (as int64), raised to >= 1 (0: dead)."""
    bits = x.astype(np.float32).view(np.uint32).astype(np.int64)
    return np.maximum(np.where(bits >> 31, bits ^ 0xFFFFFFFF, bits | 0x80000000), 1)


ROWS = {"normal": lambda g, n: g.standard_normal(n),
        "heavy_tail": lambda g, n: g.lognormal(0, 3, n),
        "few_values": lambda g, n: g.integers(0, 6, n).astype(np.float64),
        "bf16": lambda g, n: (g.standard_normal(n).astype(np.float32).view(np.uint32) & 0xFFFF0000).view(np.float32),
        "relu": lambda g, n: np.maximum(g.standard_normal(n), 0),
        "one_value": lambda g, n: np.full(n, 3.0)}


@needs_triton
@pytest.mark.parametrize("rows", list(ROWS))
@pytest.mark.parametrize("slack", [0, 4, 32])
def test_search_returns_a_threshold_that_selects_k_within_the_slack(rows, slack):
    """``kth_largest_within`` on its own, many rows: ``count(key >= t) >= want`` and either
    ``want`` to ``want + slack`` keys are at or above ``t`` (exactly ``want`` for ``kth_largest``,
    slack 0) or ``t`` is the want-th largest key (dead keys, 0, never count; ``want`` = min(k, live
    keys))."""
    gen = np.random.default_rng(1)
    block, n_rows = 256, 32
    keys = np.stack([_sort_keys(ROWS[rows](gen, block)) for _ in range(n_rows)])
    keys[gen.random(keys.shape) < 0.2] = 0                                   # dead positions
    ks = gen.choice([1, 7, 64, 200, 255, 256, 300], n_rows)
    out = torch.empty(n_rows, 2, dtype=torch.int64)
    _search[(n_rows,)](torch.from_numpy(keys), torch.from_numpy(ks.astype(np.int32)),
                       torch.full((n_rows,), slack, dtype=torch.int32), out, BLOCK=block)
    for i, (threshold, want) in enumerate(out.tolist()):
        live = keys[i][keys[i] > 0]
        assert want == min(ks[i], len(live))
        if want == 0:
            assert threshold == 0xFFFFFFFF
            continue
        at_or_above = int((live >= threshold).sum())
        kth = np.sort(live)[::-1][want - 1]
        assert at_or_above <= want + slack or threshold == kth, (i, at_or_above, want, threshold, kth)
        assert at_or_above >= want


@needs_triton
def test_load_bound_takes_the_row_pitch_class():
    """``load_bound``: W where W and the row pitch share Triton's class; W raised to the pitch's
    class where the storage holds the columns (a view of padded rows); W where it does not."""
    from dsv4ops.backends.triton.indexer_topk import load_bound, pitch_class
    assert load_bound(torch.empty(3, 100)) == 100
    padded = torch.empty(3, 128)[:, :100]
    assert load_bound(padded) == 112 == -(-100 // 16) * 16
    assert pitch_class(load_bound(padded)) == pitch_class(padded.stride(0))
    assert load_bound(torch.empty(3, 101)[:, :96]) == 97                    # pitch 101: neither class
    assert load_bound(torch.empty(2 * 128 + 100).as_strided((3, 100), (128, 1))) == 100   # storage ends at W


@needs_triton
@pytest.mark.parametrize("W", [100, 300], ids=["resident", "threshold"])
@pytest.mark.parametrize("mode", ["ranges", "decode2d"])
def test_padded_rows_never_keep_the_padding(W, mode):
    """Logits as a view of rows padded to a multiple of 16, +inf in the padding (read by the 16-byte
    loads up to ``load_bound``, never kept): the Triton selection equals the reference's."""
    kw = build_inputs("indexer_topk", "cpu", G(), R=6, W=W, k=16, mode=mode, next_n=2)
    padded = torch.full((6, W + 28), float("inf"))
    padded[:, :W] = kw["logits"]
    want = dsv4ops.indexer_topk(**kw, backend="reference")
    got = dsv4ops.indexer_topk(**{**kw, "logits": padded[:, :W]}, backend="triton")
    assert torch.equal(got.sort(dim=1).values, want.sort(dim=1).values)


# --- the reference against loops -------------------------------------------------------------

@pytest.mark.parametrize("mode", ["ranges", "decode1d", "decode2d"])
def test_indexer_topk_matches_loops(gen, mode):
    kw = build_inputs("indexer_topk", "cpu", gen, R=6, W=40, k=8, mode=mode, next_n=2, data="neg_inf")
    got = dsv4ops.reference.indexer_topk(**kw)
    for r in range(6):
        if mode == "ranges":
            s, e = int(kw["row_starts"][r]), int(kw["row_ends"][r])
        else:
            b, j = divmod(r, 2)
            L = kw["seq_lens"][b, j].item() if mode == "decode2d" else max(0, int(kw["seq_lens"][b]) - 2 + j + 1)
            s, e = 0, int(L)
        vals = sorted(((kw["logits"][r, c].item(), c - s) for c in range(s, e)), reverse=True)
        want = [v for v, _ in vals[:8]]
        row = got[r].tolist()
        m = min(8, max(0, e - s))
        assert row[m:] == [-1] * (8 - m)
        assert sorted((kw["logits"][r, s + i].item() for i in row[:m]), reverse=True) == want
        assert len(set(row[:m])) == m


# --- overlapping arguments and size limits ---------------------------------------------------

def test_topk_out_overlapping_row_ends():
    kw = build_inputs("indexer_topk", "cpu", G(), R=4, W=64, k=8, mode="ranges")
    buf = torch.zeros(36, dtype=torch.int32)
    buf[32:] = kw["row_ends"]
    kw["row_ends"], kw["out"] = buf[32:], buf[4:36].view(4, 8)
    raises_input_error("indexer_topk", kw, "out", "must not overlap 'row_ends'")


def test_topk_huge_k():
    kw = build_inputs("indexer_topk", "cpu", G(), R=4, W=64, k=8, mode="ranges")
    kw["k"] = 2 ** 40
    raises_input_error("indexer_topk", kw, "k", "int32")


def test_topk_width_beyond_int32():
    logits = torch.zeros(1, 1).expand(2, 2 ** 31)             # no memory behind the width
    with pytest.raises(dsv4ops.InputError, match="indexer_topk: argument 'logits'.*int32"):
        dsv4ops.indexer_topk(logits, 8, seq_lens=torch.ones(2, dtype=torch.int32))


# --- expanded read-only arguments the generated family does not build ------------------------

@pytest.mark.parametrize("backend", ["reference", "triton"])
def test_topk_expanded_row_starts(backend):
    kw = build_inputs("indexer_topk", "cpu", G(), R=4, W=300, k=16, mode="ranges")
    kw["row_starts"] = torch.zeros(1, dtype=torch.int32).expand(4)
    want = dsv4ops.indexer_topk(**{**kw, "row_starts": torch.zeros(4, dtype=torch.int32)}, backend="reference")
    got = dsv4ops.indexer_topk(**kw, backend=backend)
    assert torch.equal(got.sort(1).values, want.sort(1).values)



# --- the threshold path (threshold_topk.py) --------------------------------------------------

@needs_triton
@pytest.mark.parametrize("tuning", ["topk_filter_block=64", "topk_filter_block=256", "topk_filter_block=1024",
                                    "topk_filter_block=256,topk_filter_warps=8"],
                         ids=["1-key-per-thread", "2", "8-two-groups", "8-warps"])
@pytest.mark.parametrize("mode,data", [("ranges", "ties"), ("decode2d", "random"), ("ranges", "heavy_tail")])
def test_filter_blocks_of_every_shape_match_the_reference(env, tuning, mode, data):
    """The threshold path's filter with 1, 2 and 8 keys per thread (8: two 4-key groups, as sm90's
    1024-key blocks on 4 warps), a block smaller than one key per thread (raised to it) and 8 warps:
    each warp's atomic add, lane scan and per-key stores keep every key at or above the threshold
    exactly once (rows from anywhere, some empty, ties at the threshold)."""
    env(DSV4OPS_TRITON_TUNING=tuning)
    case = make_case("indexer_topk", R=4, W=1024, k=64, mode=mode, data=data, corner="empty")
    result = run_case(case, "triton", "cpu", seed=11)
    assert result.status == "pass", f"{result.message}\nrerun: {result.reproducer()}"


@needs_triton
@pytest.mark.parametrize("data,complete", [("random", True), ("heavy_tail", True), ("plateau", False)])
def test_threshold_path_collects_from_candidates_or_falls_back(monkeypatch, data, complete):
    """Rows wider than the candidate slots: random rows end with a candidate count in [k, CAP]
    (their top-k comes from the candidates), a plateau of equal keys at the threshold overflows the
    slots (the collect program selects from the row itself); both match the reference. Rows no
    wider than the slots take every live key (count = length)."""
    from dsv4ops.backends.triton import indexer_topk as triton_topk
    from dsv4ops.backends.triton import threshold_topk
    from dsv4ops.backends.triton.tuning import Tuning, _TABLE
    from dsv4ops.ops.indexer_topk import compare

    made, workspace = [], threshold_topk.workspace

    def recording_workspace(rows, cap, device):
        made.append(workspace(rows, cap, device))
        return made[-1]

    monkeypatch.setattr(threshold_topk, "workspace", recording_workspace)
    R, W, k = 4, 1024, 64                       # CPU tunables: CAP 256, a 32-key sample
    assert triton_topk.by_threshold(W, k, _TABLE.get(("cpu", None), Tuning()))
    params = dict(R=R, W=W, k=k, mode="ranges", data=data)
    kw = build_inputs("indexer_topk", "cpu", G(7), **params)
    got = dsv4ops.indexer_topk(**kw, backend="triton")
    verdict = compare(params, kw, dsv4ops.indexer_topk(**kw, backend="reference"), kw, got)
    assert verdict.ok, verdict.message
    (_, state), = made
    lengths = (kw["row_ends"] - kw["row_starts"]).tolist()
    for count, n in zip(state[:, 1].tolist(), lengths):
        if n <= 256:
            assert count == n
        else:
            assert (k <= count <= 256) == complete, (count, n)
