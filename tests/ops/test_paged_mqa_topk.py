"""paged_mqa_topk (docs/ops.md §12): the Triton kernel that selects while it scores (streaming_topk.py)
against the composition and the conformance rule, in shapes where its candidate buffers compact
many times; its workspace bound; and the chunked composition it keeps for a topk too large for it."""
import importlib

import pytest
import torch
from dsv4ops.backends.triton import streaming_topk, threshold_topk
from dsv4ops.backends.triton.tuning import tuning

import dsv4ops
from dsv4ops import formats, registry
from dsv4ops.composition import per_chunk
from dsv4ops.conformance import build_inputs, make_case, run_case
from dsv4ops.platform import multiprocessors, platform

from helpers import G, allocation_sizes, needs_triton

triton_tuning = importlib.import_module("dsv4ops.backends.triton.tuning")   # the package exports tuning()


def composition(kw):
    logits = dsv4ops.paged_mqa_logits(kw["q"], kw["kv_cache"], kw["weights"], kw["context_lens"], kw["block_table"],
                                      kw["max_context_len"], q_scale=kw.get("q_scale"), backend="reference")
    return dsv4ops.indexer_topk(logits, kw["topk"], seq_lens=kw["context_lens"], next_n=kw["q"].shape[1],
                                backend="reference")


def conforms(params, kw, got) -> bool:
    spec = registry.get_op("paged_mqa_topk").spec
    return spec.conformance.compare(params, kw, None, kw, got).ok


def poison_beyond_lengths(kw):
    """NaN keys (values and scales) in every page slot past each request's longest row."""
    values, scales = formats.index_key_views(kw["kv_cache"])
    lens = kw["context_lens"].reshape(kw["q"].shape[0], -1).amax(1)
    block = kw["kv_cache"].shape[1]
    for b, length in enumerate(lens.tolist()):
        for t in range(length, kw["max_context_len"]):
            page, slot = int(kw["block_table"][b, t // block]), t % block
            values.view(torch.uint8)[page, slot] = 0x7F
            if scales.dtype == torch.float32:
                scales[page, slot] = float("nan")


@needs_triton
@pytest.mark.parametrize("pieces", [1, 4])
@pytest.mark.parametrize("shape", [
    dict(B=3, next_n=1, context=160, topk=3),                    # 10 tiles of 16 a row: compaction every tile or two
    dict(B=2, next_n=8, context=96, topk=5, lens_dim=1),         # next_n 8, causal MTP lengths
    dict(B=3, next_n=2, context=48, topk=40),                    # rows shorter than topk
    dict(B=3, next_n=2, context=32, topk=4, corner="all_zero_len"),
    dict(B=4, next_n=2, context=48, topk=6, corner="padded_rows"),
])
def test_fused_selects_what_the_composition_selects(env, pieces, shape):
    env(DSV4OPS_TRITON_TUNING=f"fused_path=stream,fused_max_pieces={pieces}")
    params = dict(H=8, block_size=16, **shape)
    kw = build_inputs("paged_mqa_topk", "cpu", G(), **params)
    poison_beyond_lengths(kw)
    got = dsv4ops.paged_mqa_topk(**kw, backend="triton")
    want = composition(kw)
    assert torch.equal((got >= 0).sum(1), (want >= 0).sum(1))         # -1 padding where rows are short
    assert conforms(params, kw, got)


def test_the_first_shape_compacts_several_times_per_piece():
    """Interpreter tiles of 16 keys, k=3: a buffer of 19 slots; 160 keys in one piece overflow it
    after the first tile and then every few tiles (at least (160 - 19) / 16 offers past a full buffer)."""
    tune = tuning(platform("cpu"))
    plan = streaming_topk.plan(3, 3, tune.logits_block_t, tune, sms=4)
    assert tune.logits_block_t == 16 and plan.cap == 19 and (160 - plan.cap) // 16 >= 8


@needs_triton
def test_ties_keep_any_of_the_equal_keys(env):
    """Every key of a request's pages equal to one of two tokens: most logits tie exactly."""
    env(DSV4OPS_TRITON_TUNING="fused_path=stream,fused_max_pieces=2")
    params = dict(B=2, next_n=2, context=96, H=8, block_size=16, topk=7)
    kw = build_inputs("paged_mqa_topk", "cpu", G(), **params)
    values, scales = formats.index_key_views(kw["kv_cache"])
    values.view(torch.uint8)[:, 1::2] = values.view(torch.uint8)[:, :1]
    scales[:, 1::2] = scales[:, :1]
    values.view(torch.uint8)[:, 2::2] = values.view(torch.uint8)[:1, 2:3]
    scales[:, 2::2] = scales[:1, 2:3]
    got = dsv4ops.paged_mqa_topk(**kw, backend="triton")
    assert conforms(params, kw, got)
    assert torch.equal((got >= 0).sum(1), (composition(kw) >= 0).sum(1))


@needs_triton
def test_fused_passes_the_conformance_rule_with_mxfp4_keys(env):
    env(DSV4OPS_TRITON_TUNING="fused_path=stream,fused_max_pieces=2")
    case = make_case("paged_mqa_topk", B=2, next_n=3, context=64, H=32, block_size=16, layout="index_mxfp4",
                     q_fmt="mxfp4", topk=5, out=True)
    assert run_case(case, "triton", "cpu").status == "pass"


def test_workspace_formula_is_bounded_and_independent_of_the_context():
    """sm90 at B=128, next_n=1, k=512: rows * pieces * (k + max(k, tile)) * 8 bytes, under 1/8 of the
    [rows, 128K] fp32 logits buffer (64 MiB), whatever the context length (``plan`` never sees it)."""
    with dsv4ops.simulate_platform("cuda", "sm90") as plat:
        tune = tuning(plat)
    rows, k, tile = 128, 512, tune.logits_block_t
    plan = streaming_topk.plan(rows, k, tile, tune, sms=132)
    assert plan.workspace_bytes(rows) == rows * plan.pieces * (k + max(k, tile)) * 8
    assert plan.workspace_bytes(rows) < rows * 131072 * 4 / 8
    assert plan.pieces * k <= triton_tuning.FUSED_MAX_BLOCK and plan.cap <= plan.block


@needs_triton
def test_the_fused_call_allocates_only_its_workspace(env, monkeypatch):
    env(DSV4OPS_TRITON_TUNING="fused_path=stream")
    kw = build_inputs("paged_mqa_topk", "cpu", G(), B=4, next_n=2, context=256, H=4, block_size=16, topk=8)
    sizes = allocation_sizes(monkeypatch, lambda: dsv4ops.paged_mqa_topk(**kw, backend="triton"))
    tune = tuning(platform("cpu"))
    plan = streaming_topk.plan(8, 8, tune.logits_block_t, tune, sms=4)
    assert sorted(sizes) == sorted([plan.workspace_bytes(8), 8 * 8 * 4])    # the workspace and the indices


@pytest.mark.gpu
@pytest.mark.parametrize("path", ["chunks", "stream"])
def test_peak_memory_on_the_gpu_is_the_workspace(env, path):
    """32 requests of 128K keys, k=512 (the inputs of B=128 need 9 GB of host memory to build): the
    chunked path holds one chunk's logits (a 1 MiB budget here, a quarter of sm90's for a quarter of
    its 128 requests) and the top-k's workspace, the fused kernel its plan's."""
    env(DSV4OPS_TRITON_TUNING=f"fused_path={path},fused_chunk_bytes=1048576")
    kw = build_inputs("paged_mqa_topk", "cuda", G(), B=32, next_n=1, context=131072, H=64, block_size=64, topk=512,
                      lens_dim=1)
    dsv4ops.paged_mqa_topk(**kw, backend="triton")                       # compiled and warm
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    before = torch.cuda.memory_allocated()
    dsv4ops.paged_mqa_topk(**kw, backend="triton")
    torch.cuda.synchronize()
    peak = torch.cuda.max_memory_allocated() - before
    width = kw["max_context_len"]
    logits_buffer = 32 * width * 4
    device = kw["q"].device
    tune = tuning(platform(device))
    if path == "stream":
        workspace = streaming_topk.plan(32, 512, tune.logits_block_t, tune, multiprocessors(device)).workspace_bytes(32)
    else:
        rows = per_chunk(width * 4, tune.fused_chunk_bytes)
        workspace = rows * width * 4 + threshold_topk.workspace_bytes(rows, threshold_topk.capacity(512))
    fp16_queries = kw["q"].numel() * 2                                    # the software fp8 path's decode
    assert peak <= workspace + 32 * 512 * 4 + fp16_queries, (peak, workspace)
    assert peak < logits_buffer / 8, (peak, logits_buffer)


# --- the chunked composition: the default path, and a topk whose buffer cannot fit a program ------

@needs_triton
@pytest.mark.parametrize("next_n", [1, 2])
def test_the_default_path_runs_chunks_of_the_budget(env, monkeypatch, next_n):
    """``fused_path`` auto: logits of the requests that fit ``fused_chunk_bytes`` (two here), then
    the top-k, chunk after chunk; the same selection as one composed call, and no [rows, context]
    buffer."""
    kw = build_inputs("paged_mqa_topk", "cpu", G(), B=5, next_n=next_n, context=64, H=8, block_size=16, topk=8)
    row_bytes = next_n * kw["max_context_len"] * 4
    env(DSV4OPS_TRITON_TUNING=f"fused_chunk_bytes={2 * row_bytes}")            # a power of two
    sizes = allocation_sizes(monkeypatch, lambda: dsv4ops.paged_mqa_topk(**kw, backend="triton"))
    assert 2 * row_bytes in sizes and max(sizes) < 5 * row_bytes, sizes
    got = dsv4ops.paged_mqa_topk(**kw, backend="triton")
    logits = dsv4ops.paged_mqa_logits(kw["q"], kw["kv_cache"], kw["weights"], kw["context_lens"], kw["block_table"],
                                      kw["max_context_len"], backend="triton")
    want = dsv4ops.indexer_topk(logits, kw["topk"], seq_lens=kw["context_lens"], next_n=next_n, backend="triton")
    assert torch.equal(got.sort(1).values, want.sort(1).values)


@needs_triton
@pytest.mark.parametrize("next_n", [1, 2])
def test_chunks_smaller_than_the_batch_select_what_the_composition_selects(monkeypatch, next_n):
    """A workspace of one request's rows: every request is its own chunk (the last one too)."""
    kw = build_inputs("paged_mqa_topk", "cpu", G(), B=5, next_n=next_n, context=40, H=8, block_size=16, topk=16)
    monkeypatch.setattr(triton_tuning, "FUSED_MAX_BLOCK", 16)                 # no topk fits: the chunked path
    monkeypatch.setattr(triton_tuning, "LARGE_TOPK_CHUNK_BYTES", next_n * kw["max_context_len"] * 4)
    assert per_chunk(next_n * kw["max_context_len"] * 4, triton_tuning.LARGE_TOPK_CHUNK_BYTES) == 1
    got = dsv4ops.paged_mqa_topk(**kw, backend="triton")
    logits = dsv4ops.paged_mqa_logits(kw["q"], kw["kv_cache"], kw["weights"], kw["context_lens"], kw["block_table"],
                                      kw["max_context_len"], backend="triton")
    want = dsv4ops.indexer_topk(logits, kw["topk"], seq_lens=kw["context_lens"], next_n=next_n, backend="triton")
    assert torch.equal(got.sort(1).values, want.sort(1).values)


@needs_triton
def test_chunked_call_passes_the_conformance_rule(monkeypatch):
    monkeypatch.setattr(triton_tuning, "FUSED_MAX_BLOCK", 16)
    monkeypatch.setattr(triton_tuning, "LARGE_TOPK_CHUNK_BYTES", 3 * 48 * 4)     # three rows per chunk
    case = make_case("paged_mqa_topk", B=4, next_n=2, context=40, H=8, block_size=16, topk=8, out=True)
    assert run_case(case, "triton", "cpu").status == "pass"
