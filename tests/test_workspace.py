"""The gathered bf16 workspace that FlashMLA's and AITER's prefill adapters read (dsv4ops/workspace.py)."""
import torch

from dsv4ops import formats
from dsv4ops.conformance import build_inputs
from dsv4ops.ops import OPS
from dsv4ops.workspace import gather_workspace


def _args(**kw):
    return OPS["sparse_mla_prefill"].validate_call(**kw).args


def test_workspace_rows_and_indices_match_the_caches():
    kw = build_inputs("sparse_mla_decode", "cpu", torch.Generator().manual_seed(3), T=5, H=4, topk=32, layout="fp8_ds_mla",
                                  block_size=16, extra_topk=64, extra_block_size=2, corner="pad_middle")
    a = _args(**kw)
    rows, idx = gather_workspace(a, align=128)
    assert rows.dtype == torch.bfloat16 and idx.dtype == torch.int32 and idx.shape == (5, 128)
    assert bool((idx[:, 96:] == -1).all())                                # padding columns
    for seg, (cache, bs, ind, lens) in enumerate(((a.kv_cache, 16, a.indices, a.topk_lens),
                                                  (a.extra_kv_cache, 2, a.extra_indices, a.extra_topk_lens))):
        cols = idx[:, :32] if seg == 0 else idx[:, 32:96]
        selected = (ind != -1) & (torch.arange(ind.shape[1]) < lens[:, None])
        assert torch.equal(cols != -1, selected)
        want = formats.read_kv(cache, "fp8_ds_mla", bs, ind[selected]).to(torch.bfloat16)
        assert torch.equal(rows[cols[selected].long()], want)              # exact: MODEL1 rows are bf16 values


def test_workspace_dequantizes_only_referenced_pages():
    cache = formats.pack_kv(torch.randn(64 * 16, 512) * 0.1, "bf16", 16)   # 64 pages
    idx = torch.tensor([[3, 5, -1], [40 * 16 + 1, 3, 7]], dtype=torch.int32)
    a = _args(q=torch.zeros(2, 8, 512, dtype=torch.bfloat16), kv_cache=cache, indices=idx, layout="bf16",
              block_size=16, softmax_scale=1.0)
    rows, ws_idx = gather_workspace(a)
    assert rows.shape == (2 * 16, 512)                                     # pages 0 and 40
    assert ws_idx.tolist() == [[3, 5, -1], [17, 3, 7]]
    empty = _args(q=torch.zeros(1, 8, 512, dtype=torch.bfloat16), kv_cache=cache,
                  indices=torch.full((1, 4), -1, dtype=torch.int32), layout="bf16", block_size=16, softmax_scale=1.0)
    rows, ws_idx = gather_workspace(empty)
    assert rows.shape == (1, 512) and bool((rows == 0).all()) and bool((ws_idx == -1).all())
