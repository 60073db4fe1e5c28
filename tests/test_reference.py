"""Every reference against brute-force loops written independently here (not via the reference)."""
import importlib
import math
import struct

import pytest
import torch

import dsv4ops
from dsv4ops import formats
from dsv4ops.conformance import build_inputs


def _bf16(x: float) -> float:
    return torch.tensor(x, dtype=torch.float32).to(torch.bfloat16).item()


def _decode_ds_mla_slot(cache, block_size, slot):
    """Decode one MODEL1 token by walking its bytes (docs/ops.md §1 layout A)."""
    page = cache[slot // block_size].tolist()
    off = slot % block_size
    data = page[off * 576:(off + 1) * 576]
    scale_row = page[block_size * 576 + off * 8: block_size * 576 + off * 8 + 8]
    fp8 = torch.tensor(data[:448], dtype=torch.uint8).view(torch.float8_e4m3fn).float().tolist()
    row = [fp8[i] * 2.0 ** (scale_row[i // 64] - 127) for i in range(448)]
    for i in range(64):
        lo, hi = data[448 + 2 * i], data[449 + 2 * i]
        row.append(struct.unpack("<f", struct.pack("<I", (hi << 24) | (lo << 16)))[0])
    return row


def test_qnorm_rope_matches_loops(gen):
    kw = build_inputs("qnorm_rope_kv_insert", "cpu", gen, T=3, H=2, layout="bf16", block_size=4, num_blocks=2, skip_slots=0)
    q0, kv = kw["q"].clone(), kw["kv"]
    out = dsv4ops.reference.qnorm_rope_kv_insert(**kw)
    cs = kw["cos_sin_cache"]
    for t in range(3):
        p = int(kw["positions"][t])
        for h in range(2):
            x = q0[t, h].double().tolist()
            r = 1.0 / math.sqrt(sum(v * v for v in x) / 512 + 1e-6)
            y = [v * r for v in x]
            for i in range(32):
                c, s = cs[p, i].item(), cs[p, 32 + i].item()
                e, o = y[448 + 2 * i], y[449 + 2 * i]
                assert out[t, h, 448 + 2 * i].item() == pytest.approx(_bf16(e * c - o * s), rel=2 ** -7, abs=1e-6)
                assert out[t, h, 449 + 2 * i].item() == pytest.approx(_bf16(e * s + o * c), rel=2 ** -7, abs=1e-6)
            assert out[t, h, :448].float().tolist() == pytest.approx([_bf16(v) for v in y[:448]], rel=2 ** -7)
        slot = int(kw["slot_mapping"][t])
        row = kw["kv_cache"][slot // 4, slot % 4]
        assert torch.equal(row[:448], kv[t, :448])
        for i in range(32):
            c, s = cs[p, i].item(), cs[p, 32 + i].item()
            e, o = kv[t, 448 + 2 * i].item(), kv[t, 449 + 2 * i].item()
            assert row[448 + 2 * i].item() == pytest.approx(_bf16(e * c - o * s), rel=2 ** -7, abs=1e-6)


def test_sparse_decode_matches_loops(gen):
    kw = build_inputs("sparse_mla_decode", "cpu", gen, T=3, H=2, topk=8, layout="fp8_ds_mla", block_size=4,
                                  extra_topk=4, extra_block_size=2, corner="duplicates")
    out, lse = dsv4ops.reference.sparse_mla_decode(**kw)
    for t in range(3):
        keys = []
        for idx_name, len_name, cache_name, bs in (("indices", "topk_lens", "kv_cache", 4),
                                                   ("extra_indices", "extra_topk_lens", "extra_kv_cache", 2)):
            for j in range(kw[idx_name].shape[1]):
                i = int(kw[idx_name][t, j])
                if i != -1 and j < int(kw[len_name][t]):
                    keys.append(_decode_ds_mla_slot(kw[cache_name], bs, i))
        for h in range(2):
            q = kw["q"][t, h].double().tolist()
            scores = [sum(a * b for a, b in zip(q, k)) * kw["softmax_scale"] for k in keys]
            if not scores:
                assert lse[t, h].item() == math.inf and out[t, h].abs().max().item() == 0
                continue
            m = max(scores)
            z = sum(math.exp(s - m) for s in scores)
            ref_lse = m + math.log(z)
            sink = kw["attn_sink"][h].item()
            o = [sum(math.exp(s - ref_lse) * k[d] for s, k in zip(scores, keys)) for d in range(512)]
            factor = 1 / (1 + math.exp(sink - ref_lse))
            assert lse[t, h].item() == pytest.approx(ref_lse, rel=1e-5)
            assert out[t, h].float().tolist() == pytest.approx([v * factor for v in o], rel=2 ** -7, abs=1e-4)


def test_paged_logits_matches_loops(gen):
    kw = build_inputs("paged_mqa_logits", "cpu", gen, B=2, next_n=2, context=10, H=3, block_size=4, lens_dim=1)
    got = dsv4ops.reference.paged_mqa_logits(**kw)
    keys = formats.unpack_index_keys(kw["kv_cache"])
    for b in range(2):
        L = int(kw["context_lens"][b])
        for j in range(2):
            r = b * 2 + j
            for t in range(kw["max_context_len"]):
                if t >= L - 2 + j + 1:
                    continue
                k = keys[int(kw["block_table"][b, t // 4]), t % 4].double()
                want = sum(kw["weights"][r, h].item() * max(0.0, float(kw["q"][b, j, h].double() @ k)) for h in range(3))
                assert got[r, t].item() == pytest.approx(want, rel=1e-4, abs=1e-4)


@pytest.mark.parametrize("ranges", ["causal", "requests", "random"])
def test_mqa_logits_matches_loops(gen, ranges, monkeypatch):
    """Loops in float64 over [ks, ke); -inf elsewhere; row chunks (forced small here) change only fp32 rounding."""
    module = importlib.import_module("dsv4ops.reference.impl.mqa_logits")      # the module, not the public function
    kw = build_inputs("mqa_logits", "cpu", gen, T=7, S=19, H=3, ranges=ranges)
    full = dsv4ops.reference.mqa_logits(**kw)
    monkeypatch.setattr(module, "CHUNK_ELEMENTS", 3 * 19 * 2)             # two rows per chunk
    torch.testing.assert_close(dsv4ops.reference.mqa_logits(**kw), full, rtol=1e-6, atol=1e-6)   # fp32 sum order
    for t in range(7):
        ks, ke = int(kw["ks"][t]), int(kw["ke"][t])
        assert bool((full[t, :ks] == float("-inf")).all() and (full[t, ke:] == float("-inf")).all())
        for s in range(ks, ke):
            k = kw["k"][s].double() * kw["k_scale"][s].item()
            want = sum(kw["weights"][t, h].item() * max(0.0, float(kw["q"][t, h].double() @ k)) for h in range(3))
            assert full[t, s].item() == pytest.approx(want, rel=1e-5, abs=1e-5)


def test_fp8_einsum_matches_loops(gen):
    kw = build_inputs("fp8_einsum", "cpu", gen, B=2, H=2, D=128, R=256)
    got = dsv4ops.reference.fp8_einsum(**kw)
    a, sa, b, sb = kw["a"].double(), kw["a_scale"].double(), kw["b"].double(), kw["b_scale"].double()
    for bi in range(2):
        for h in range(2):
            for n in (0, 77, 127):
                want = sum(a[bi, h, r] * sa[bi, h, r // 128] * b[h, n, r] * sb[h, n // 128, r // 128]
                           for r in range(256))
                assert got[bi, h, n].item() == pytest.approx(_bf16(float(want)), rel=2 ** -8)


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


def test_sink_and_lonely_edges(gen):
    kw = build_inputs("sparse_mla_decode", "cpu", gen, T=2, H=4, topk=8, layout="bf16", block_size=4, sink="inf",
                                  lens="full")
    out, lse = dsv4ops.reference.sparse_mla_decode(**kw)
    assert torch.all(out[:, 0::2] == 0)              # sink +inf: output 0, lse unchanged
    no_sink, lse2 = dsv4ops.reference.sparse_mla_decode(**{**kw, "attn_sink": None})
    assert torch.equal(out[:, 1::2], no_sink[:, 1::2])  # sink -inf: no effect
    assert torch.equal(lse, lse2)
    kw["indices"][:] = -1
    out, lse = dsv4ops.reference.sparse_mla_decode(**kw)
    assert torch.all(out == 0) and torch.all(lse == math.inf)


def test_prefill_reference_is_decode_in_chunks(monkeypatch):
    """The prefill reference, split into token chunks, equals the decode reference bit for bit
    (out= filled in place, lse per chunk, need_lse honoured)."""
    monkeypatch.setattr(importlib.import_module("dsv4ops.reference.impl.sparse_mla_prefill"), "CHUNK_ELEMENTS", 3 * 96 * 512)
    kw = build_inputs("sparse_mla_decode", "cpu", torch.Generator().manual_seed(5), T=7, H=4, topk=32, layout="fp8_ds_mla",
                                  extra_topk=64, extra_block_size=16, corner="zero_len")
    out_d, lse_d = dsv4ops.reference.sparse_mla_decode(**kw)
    buf = torch.full_like(out_d, float("nan"))
    out_p, lse_p = dsv4ops.reference.sparse_mla_prefill(**kw, out=buf)
    assert out_p is buf and torch.equal(out_p, out_d) and torch.equal(lse_p, lse_d)
    assert dsv4ops.reference.sparse_mla_prefill(**{**kw, "need_lse": False})[1] is None
