"""The conformance matrix under pytest: every backend available here, every case of the tier
(``DSV4OPS_TIER``, default quick) of every op it implements, against the reference. Plus proof that
the suite catches deliberately broken implementations."""
import os

import pytest
import torch

import dsv4ops
from dsv4ops import registry
from dsv4ops.conformance import cases, make_case, run_case
from dsv4ops.ops import OP_NAMES
from dsv4ops.platform import default_device
from dsv4ops.registry import Backend, register_backend, unregister_backend

TIER = os.environ.get("DSV4OPS_TIER", "quick")
DEVICE = default_device()
BACKENDS = [b.name for b in dsv4ops.backends() if b.available and b.name != "reference"]
MATRIX = [(name, case) for name in ["reference", *BACKENDS] for op in OP_NAMES
          if op in registry.get_backend(name).implementations for case in cases(op, TIER)]


@pytest.mark.parametrize("backend,case", MATRIX, ids=[f"{b}-{c.id}" for b, c in MATRIX])
def test_conformance(backend, case):
    result = run_case(case, backend, DEVICE, seed=hash(case.id) % 10_000)
    if result.status == "skip":
        pytest.skip(f"{backend} declines: {result.message}")
    assert result.status == "pass", f"{result.message}\nrerun: {result.reproducer()}"


# --- the suite must fail on broken implementations --------------------------------------------

def _ref(op):
    return getattr(dsv4ops.reference, op)


def decode_ignoring_sink(**kw):
    return _ref("sparse_mla_decode")(**{**kw, "attn_sink": None})


def topk_absolute_indices(**kw):
    out = _ref("indexer_topk")(**kw)
    starts = kw["row_starts"] if kw["row_starts"] is not None else torch.zeros(out.shape[0], dtype=torch.int32)
    return torch.where(out >= 0, out + starts[:, None], out)


def insert_forgetting_pad_byte(**kw):
    cache = kw["kv_cache"]
    saved = cache.clone()
    result = _ref("qnorm_rope_kv_insert")(**kw)
    bs = kw["block_size"]
    scales = cache[:, bs * 576: bs * 584].view(cache.shape[0], bs, 8)
    scales[..., 7] = saved[:, bs * 576: bs * 584].view(cache.shape[0], bs, 8)[..., 7]
    return result


def logits_not_cleaned(**kw):
    out = _ref("paged_mqa_logits")(**kw)
    return torch.where(out == float("-inf"), 0.0, out)


def einsum_ignoring_a_scale(**kw):
    return _ref("fp8_einsum")(**{**kw, "a_scale": torch.ones_like(kw["a_scale"])})


def decode_leaving_out_unwritten(**kw):
    out, lse = _ref("sparse_mla_decode")(**{**kw, "out": None})
    if kw["out"] is not None:
        kw["out"][:, :, 1:].copy_(out[:, :, 1:])
        return kw["out"], lse
    return out, lse


def topk_ignoring_lengths(**kw):
    R, W = kw["logits"].shape
    return _ref("indexer_topk")(kw["logits"], kw["k"], row_starts=torch.zeros(R, dtype=torch.int32),
                                row_ends=torch.full((R,), W, dtype=torch.int32))


def _as_contiguous_strides(t):
    """What a kernel that assumes contiguous rows reads for ``t``: its storage from ``t``'s offset."""
    return t.as_strided(t.shape, torch.empty(t.shape).stride())


def logits_ignoring_table_strides(**kw):
    return _ref("paged_mqa_logits")(**{**kw, "block_table": _as_contiguous_strides(kw["block_table"])})


def einsum_ignoring_scale_strides(**kw):
    return _ref("fp8_einsum")(**{**kw, "a_scale": _as_contiguous_strides(kw["a_scale"])})


def inv_rope_rotating_forward(**kw):
    cs = kw["cos_sin_cache"]
    return _ref("inv_rope_fp8_quant")(**{**kw, "cos_sin_cache": torch.cat([cs[:, :32], -cs[:, 32:]], dim=1)})


def inv_rope_with_cache_floor(**kw):
    a, scale = _ref("inv_rope_fp8_quant")(**kw)         # amax floor 1e-4 instead of 1e-10: all-zero blocks
    zero = (a.view(torch.uint8) & 0x7F).view(*scale.shape, 128).amax(-1) == 0
    return a, torch.where(zero, 2.0 ** -22, scale)


def compress_rope_at_last_position(**kw):
    cs, r = kw["cos_sin_cache"], kw["ratio"]
    shifted = torch.cat([cs[r - 1:], cs[-1:].expand(r - 1, -1)])
    return _ref("compress_kv_insert")(**{**kw, "cos_sin_cache": shifted})


def compress_forgetting_ape(**kw):
    return _ref("compress_kv_insert")(**{**kw, "ape": torch.zeros_like(kw["ape"])})


def compress_writing_every_token(**kw):
    _ref("compress_kv_insert")(**kw)
    n = kw["slot_mapping"].shape[0]
    other = ((kw["positions"][:n] + 1) % kw["ratio"] != 0) & (kw["slot_mapping"] >= 0)
    rows = torch.zeros(int(other.sum()), 512)
    dsv4ops.formats.write_kv(kw["kv_cache"], "fp8_ds_mla", kw["block_size"], kw["slot_mapping"][other], rows)


def mqa_logits_compressed_columns(**kw):
    """DeepGEMM's max_seqlen_k form mistaken for the contract's: row t's scores at columns [0, ke - ks)."""
    out = _ref("mqa_logits")(**kw)
    moved = torch.full_like(out, float("-inf"))
    for t, (s, e) in enumerate(zip(kw["ks"].tolist(), kw["ke"].tolist())):
        moved[t, : e - s] = out[t, s:e]
    return moved


def mqa_logits_ignoring_k_scale(**kw):
    return _ref("mqa_logits")(**{**kw, "k_scale": torch.ones_like(kw["k_scale"])})


BROKEN = [
    ("sparse_mla_decode", decode_ignoring_sink, dict(T=3, H=4, topk=32, layout="fp8_ds_mla")),
    ("indexer_topk", topk_absolute_indices, dict(R=4, W=300, k=16, mode="ranges")),
    ("qnorm_rope_kv_insert", insert_forgetting_pad_byte, dict(T=4, H=2, layout="fp8_ds_mla", block_size=16,
                                                              num_blocks=2, skip_slots=0)),
    ("paged_mqa_logits", logits_not_cleaned, dict(B=2, next_n=2, context=40, H=4, block_size=16, clean=True)),
    ("fp8_einsum", einsum_ignoring_a_scale, dict(B=3, H=2, D=128, R=256)),
    ("sparse_mla_decode", decode_leaving_out_unwritten, dict(T=2, H=4, topk=32, layout="bf16", out=True)),
    ("indexer_topk", topk_ignoring_lengths, dict(R=4, W=100, k=8, mode="decode1d", next_n=2)),
    ("paged_mqa_logits", logits_ignoring_table_strides, dict(B=3, next_n=2, context=40, H=4, block_size=16,
                                                            strided="block_table:sliced")),
    ("fp8_einsum", einsum_ignoring_scale_strides, dict(B=5, H=2, D=128, R=256, strided="a_scale:transposed")),
    ("mqa_logits", mqa_logits_compressed_columns, dict(T=6, S=40, H=4, ranges="requests")),
    ("mqa_logits", mqa_logits_ignoring_k_scale, dict(T=6, S=40, H=4, ranges="random", topk=8)),
    ("inv_rope_fp8_quant", inv_rope_rotating_forward, dict(T=3, H=8, n_groups=2)),
    ("inv_rope_fp8_quant", inv_rope_with_cache_floor, dict(T=3, H=8, n_groups=2, corner="zero_head")),
    ("compress_kv_insert", compress_rope_at_last_position, dict(layout="fp8_ds_mla", ratio=4, reqs=((0, 9),),
                                                                block_size=4)),
    ("compress_kv_insert", compress_forgetting_ape, dict(layout="index_fp8", ratio=4, reqs=((2, 7),), block_size=4)),
    ("compress_kv_insert", compress_writing_every_token, dict(layout="fp8_ds_mla", ratio=4, reqs=((0, 9),),
                                                              block_size=4)),
]


@pytest.mark.parametrize("op,impl,params", BROKEN, ids=[f.__name__ for _, f, _ in BROKEN])
def test_suite_catches_broken_implementation(op, impl, params):

    broken = register_backend(Backend("broken", ("cpu", "cuda")))
    broken.implements(op, lambda args: impl(**args._asdict()), priority=-1)   # typed args -> keywords
    try:
        case = make_case(op, **params)
        result = run_case(case, "broken", "cpu", seed=3)
        assert result.status == "fail", result
        assert run_case(case, "reference", "cpu", seed=3).status == "pass"
    finally:
        unregister_backend("broken")


# --- scales one step off on every block: allowed only where a block's amax is at the boundary ----

def _double_ue8m0_blocks(values: torch.Tensor, scales: torch.Tensor, block: int):
    """In place: each UE8M0 scale byte ``[..., n]`` one power of two up, its e4m3 values ``[..., n *
    block]`` (uint8) halved to match (a writer that always rounds its scale up)."""
    scales += 1
    halved = values.view(torch.float8_e4m3fn).float() / 2
    values.copy_(dsv4ops.quant.to_fp8(halved).view(torch.uint8))


def _written_records(cache, layout, bs, slots):
    data, scales = dsv4ops.formats.record_views(cache, layout, bs)
    return data[slots // bs, slots % bs], scales[slots // bs, slots % bs], data, scales


def insert_doubling_rope_scales(**kw):
    result = _ref("qnorm_rope_kv_insert")(**kw)
    slots = kw["slot_mapping"][kw["slot_mapping"] >= 0].long()
    values, scales, data, scale_view = _written_records(kw["kv_cache"], kw["layout"], kw["block_size"], slots)
    rope = dsv4ops.formats.NOPE_DIM // 32                           # the two RoPE blocks of 32
    _double_ue8m0_blocks(values[:, rope * 32:], scales[:, rope:], 32)
    data[slots // kw["block_size"], slots % kw["block_size"]] = values
    scale_view[slots // kw["block_size"], slots % kw["block_size"]] = scales
    return result


def _compress_slots(kw):
    from dsv4ops.ops.compress_kv_insert import entries_written
    return kw["slot_mapping"][entries_written(kw)].long()


def compress_doubling_scales(**kw):
    _ref("compress_kv_insert")(**kw)
    slots, bs = _compress_slots(kw), kw["block_size"]
    values, scales, data, scale_view = _written_records(kw["kv_cache"], kw["layout"], bs, slots)
    _double_ue8m0_blocks(values, scales, 32)
    data[slots // bs, slots % bs], scale_view[slots // bs, slots % bs] = values, scales


def compress_nvfp4_scale_code_up(**kw):
    _ref("compress_kv_insert")(**kw)
    slots, bs = _compress_slots(kw), kw["block_size"]
    packed, scales, data, scale_view = _written_records(kw["kv_cache"], kw["layout"], bs, slots)
    quant = dsv4ops.quant
    x = quant.decode_nvfp4(packed, scales).reshape(len(slots), -1, quant.NV_BLOCK)
    up = scales + 1
    codes = quant.e2m1_code(x / up.view(torch.float8_e4m3fn).float()[..., None]).reshape(len(slots), -1)
    data[slots // bs, slots % bs] = codes[:, 0::2] | (codes[:, 1::2] << 4)
    scale_view[slots // bs, slots % bs] = up


def inv_rope_doubling_scales(**kw):
    values, scales = _ref("inv_rope_fp8_quant")(**kw)
    return dsv4ops.quant.to_fp8(values.float() / 2), scales * 2


SCALE_STEP_BROKEN = [
    ("qnorm_rope_kv_insert", insert_doubling_rope_scales, dict(T=6, H=2, layout="mxfp8_v41", block_size=16,
                                                               num_blocks=2, skip_slots=0)),
    ("compress_kv_insert", compress_doubling_scales, dict(layout="mxfp8_v41", ratio=2, reqs=((1, 8), (6, 7)),
                                                          decode=3, block_size=4)),
    ("compress_kv_insert", compress_nvfp4_scale_code_up, dict(layout="nvfp4_v41", ratio=1, reqs=((0, 5), (9, 8)),
                                                              block_size=4)),
    ("inv_rope_fp8_quant", inv_rope_doubling_scales, dict(T=5, H=16, n_groups=2)),
    ("inv_rope_fp8_quant", inv_rope_doubling_scales, dict(T=5, H=16, n_groups=2, block=32)),
]


@pytest.mark.parametrize("op,impl,params", SCALE_STEP_BROKEN, ids=[f"{f.__name__}-{i}" for i, (_, f, _)
                                                                      in enumerate(SCALE_STEP_BROKEN)])
def test_suite_catches_a_scale_one_step_off_everywhere(op, impl, params):
    """A writer whose every block scale is one step off the reference's (its values rescaled to
    match, so they stay within one e4m3 / e2m1 step): conformance fails on the scale rule, which
    allows the step only for blocks whose amax is at the boundary between the two scales."""
    broken = register_backend(Backend("broken", ("cpu", "cuda")))
    broken.implements(op, lambda args: impl(**args._asdict()), priority=-1)
    try:
        case = make_case(op, **params)
        result = run_case(case, "broken", "cpu", seed=3)
        assert result.status == "fail" and "scales:" in result.message and "boundary" in result.message, result
        assert "dequantized values" not in result.message, result    # the scale rule, not the value rule
        assert run_case(case, "reference", "cpu", seed=3).status == "pass"
    finally:
        unregister_backend("broken")


def test_cli_check_reports_and_exits(tmp_path, capsys):
    from dsv4ops.cli import main
    path = tmp_path / "r.json"
    assert main(["check", "--backends", "reference", "--ops", "indexer_topk", "--json", str(path)]) == 0
    import json
    data = json.loads(path.read_text())
    assert data["meta"]["tier"] == "quick" and all(r["status"] == "pass" for r in data["results"])
    assert "passed" in capsys.readouterr().out


def test_repeat_mode_finds_a_backend_whose_launches_differ(monkeypatch):
    """``--repeat``: a backend that returns a different (still correct) top-k order on its second
    launch passes one call and fails the repeat check; a deterministic one passes both."""
    reference = dsv4ops.registry.get_backend("reference").implementations["indexer_topk"][0].fn
    launches = []

    def flaky(a):
        launches.append(1)
        out = reference(a)
        return out.flip(1) if len(launches) % 2 == 0 else out      # same sets, other order

    register_backend(Backend("flaky", ("cpu",))).implements("indexer_topk", flaky, priority=1)
    try:
        case = make_case("indexer_topk", R=4, W=64, k=8, mode="ranges")
        assert run_case(case, "flaky", "cpu").status == "pass"
        result = run_case(case, "flaky", "cpu", repeat=3)
        assert result.status == "fail" and "launch 2 of 3 differs" in result.message
        assert run_case(case, "reference", "cpu", repeat=3).status == "pass"
        assert run_case(make_case("qnorm_rope_kv_insert", T=3, H=2, layout="fp8_ds_mla", block_size=16,
                                  num_blocks=2), "triton", "cpu", repeat=2).status == "pass"
    finally:
        unregister_backend("flaky")
