"""One representative call per routed op, built from a DeepSeek-V4 attention layer's configuration,
for the load-time check (``routing.require``). Imports no vLLM.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from ... import formats

SWA_BLOCK = 64          # vLLM's SWA cache page (tokens)
INDEX_BLOCK = 64        # vLLM's indexer key cache page (compressed tokens)
TOKENS_PER_PAGE = 256   # vLLM's compressed cache page covers 256 tokens: 256 // ratio entries


@dataclass(frozen=True)
class LayerConfig:
    """What decides whether dsv4ops serves a layer: heads on this rank, o-projection groups and
    rank, compression ratio (0/1: SWA only), the indexer's heads and top-k, the device."""

    heads: int
    groups: int
    o_lora_rank: int
    ratio: int
    window: int
    index_heads: int
    index_topk: int
    device: str

    @property
    def compressed_block(self) -> int:
        return TOKENS_PER_PAGE // self.ratio


def _rand(cfg, *shape, dtype=torch.bfloat16):
    return torch.randn(*shape, dtype=torch.float32, device=cfg.device).to(dtype)


def _ints(cfg, *shape, dtype=torch.int32):
    return torch.zeros(*shape, dtype=dtype, device=cfg.device)


def insert(cfg: LayerConfig) -> list:
    cache = formats.allocate_kv_cache(1, SWA_BLOCK, "fp8_ds_mla", device=cfg.device)
    return [("qnorm_rope_kv_insert",
             (_rand(cfg, 1, cfg.heads, 512), _rand(cfg, 1, 512), _ints(cfg, 1, dtype=torch.int64),
              _rand(cfg, 8, 64, dtype=torch.float32), cache, _ints(cfg, 1, dtype=torch.int64)),
             dict(layout="fp8_ds_mla", block_size=SWA_BLOCK))]


def attention(cfg: LayerConfig) -> list:
    kwargs = dict(layout="fp8_ds_mla", block_size=SWA_BLOCK, softmax_scale=512 ** -0.5,
                  attn_sink=_rand(cfg, cfg.heads, dtype=torch.float32), need_lse=False)
    if cfg.ratio > 1:
        width = cfg.index_topk if cfg.ratio == 4 else 1
        kwargs.update(extra_kv_cache=formats.allocate_kv_cache(1, cfg.compressed_block, "fp8_ds_mla", device=cfg.device),
                      extra_indices=_ints(cfg, 1, width), extra_topk_lens=_ints(cfg, 1) + 1,
                      extra_block_size=cfg.compressed_block)
    args = (_rand(cfg, 1, cfg.heads, 512), formats.allocate_kv_cache(1, SWA_BLOCK, "fp8_ds_mla", device=cfg.device),
            _ints(cfg, 1, cfg.window), _ints(cfg, 1) + 1)
    return [(op, args, kwargs) for op in ("sparse_mla_decode", "sparse_mla_prefill")]


def o_proj(cfg: LayerConfig) -> list:
    K = cfg.heads // cfg.groups * 512
    fp8 = torch.float8_e4m3fn
    return [
        ("inv_rope_fp8_quant", (_rand(cfg, 1, cfg.heads, 512), _ints(cfg, 1, dtype=torch.int64),
                                _rand(cfg, 8, 64, dtype=torch.float32)), dict(n_groups=cfg.groups)),
        ("fp8_einsum", ("bhr,hdr->bhd", _rand(cfg, 1, cfg.groups, K, dtype=fp8),
                        torch.ones(1, cfg.groups, K // 128, dtype=torch.float32, device=cfg.device),
                        _rand(cfg, cfg.groups, cfg.o_lora_rank, K, dtype=fp8),
                        torch.ones(cfg.groups, cfg.o_lora_rank // 128, K // 128, dtype=torch.float32, device=cfg.device)), {}),
    ]


def indexer(cfg: LayerConfig) -> list:
    keys = formats.pack_index_keys(torch.randn(1, INDEX_BLOCK, 128, dtype=torch.float32), scale_fmt="ue8m0").to(cfg.device)
    return [("paged_mqa_topk",
             (_rand(cfg, 1, 1, cfg.index_heads, 128, dtype=torch.float8_e4m3fn), keys,
              _rand(cfg, 1, cfg.index_heads, dtype=torch.float32), _ints(cfg, 1) + 1, _ints(cfg, 1, 1), INDEX_BLOCK,
              cfg.index_topk), {}),
            ("mqa_topk",
             (_rand(cfg, 1, cfg.index_heads, 128, dtype=torch.float8_e4m3fn), _rand(cfg, 4, 128, dtype=torch.float8_e4m3fn),
              torch.ones(4, dtype=torch.float32, device=cfg.device), _rand(cfg, 1, cfg.index_heads, dtype=torch.float32),
              _ints(cfg, 1), _ints(cfg, 1) + 4, cfg.index_topk), {})]


def compressor(cfg: LayerConfig) -> list:
    """The attention compressor's call (D = 512); C4 layers' indexer compressor (D = 128) too."""
    calls = []
    heads = [(512, "fp8_ds_mla", formats.allocate_kv_cache(1, cfg.compressed_block, "fp8_ds_mla",
                                                           device=cfg.device), cfg.compressed_block)]
    if cfg.ratio == 4:
        heads.append((128, "index_fp8", torch.zeros(1, INDEX_BLOCK, 1, 132, dtype=torch.uint8, device=cfg.device),
                      INDEX_BLOCK))
    for dim, layout, cache, block in heads:
        c = formats.window_overlap(cfg.ratio)
        state_block = 4 if cfg.ratio == 4 else 8
        args = (_rand(cfg, 1, c * dim, dtype=torch.float32), _rand(cfg, 1, c * dim, dtype=torch.float32),
                _ints(cfg, 1, dtype=torch.int64), _rand(cfg, cfg.ratio, c * dim, dtype=torch.float32),
                _rand(cfg, dim, dtype=torch.float32), _rand(cfg, 8, 64, dtype=torch.float32),
                torch.zeros(1, state_block, 2 * c * dim, dtype=torch.float32, device=cfg.device), _ints(cfg, 1, dtype=torch.int64),
                _ints(cfg, 1, 1), _ints(cfg, 1), cache, _ints(cfg, 1, dtype=torch.int64) - 1)
        calls.append(("compress_kv_insert", args, dict(layout=layout, ratio=cfg.ratio, block_size=block)))
    return calls


BUILDERS = {"insert": insert, "attention": attention, "o_proj": o_proj, "indexer": indexer, "compressor": compressor}


def steps_of(cfg: LayerConfig) -> tuple[str, ...]:
    """The vLLM steps a layer of this configuration runs."""
    return ("insert", "attention", "o_proj") + (("compressor",) if cfg.ratio > 1 else ()) + \
        (("indexer",) if cfg.ratio == 4 else ())
