"""``Dsv4opsAttention``: vLLM's DeepSeek-V4 attention layer with its kernels run through dsv4ops.

One mixin serves every platform: the plugin puts it in front of the attention class vLLM picks
(the CPU build's ``DeepseekV4CPUAttention``, or whatever ``_select_dsv4_attn_cls`` returns on a
GPU), so the layer keeps vLLM's projections, caches and metadata and replaces the steps of its
forward body (vLLM's method names, shared by ``DeepseekV4Attention`` and its subclasses):

- ``_fused_qnorm_rope_kv_insert`` -> ``qnorm_rope_kv_insert`` (the SWA cache, fp8_ds_mla)
- the indexer's logits + top-k (``_sparse_indexer_and_attn``) -> ``paged_mqa_topk``
- ``forward_mqa`` -> ``sparse_mla_decode`` (decode tokens) / ``sparse_mla_prefill`` (the rest)
- ``_o_proj`` -> ``inv_rope_fp8_quant`` + ``fp8_einsum``, then vLLM's ``wo_b``
- the compressors' ``forward`` (``Dsv4opsCompressor``) -> ``compress_kv_insert``

A step whose op is named in DSV4OPS_VLLM_NATIVE calls vLLM's method instead. Imported by
``register()`` only (it imports vLLM).
"""
from __future__ import annotations

import functools

import torch
from vllm.forward_context import get_forward_context

from ... import formats
from . import calls as representative
from .mapping import dense_compressed_local, fp8_weight_blocks, window_local
from .paging import PageWindow, request_keys, table_pages
from .routing import call, require, routed

DS_MLA = "fp8_ds_mla"


def _cos_sin(rotary_emb) -> torch.Tensor:
    """vLLM's ``[max_pos, 64]`` cos|sin table (GPT-J pairs, dsv4ops §0) as fp32, contiguous."""
    return rotary_emb.cos_sin_cache.to(torch.float32).contiguous()


def _ds_mla_page(block_size: int) -> tuple[int]:
    return (formats.ds_mla_page_bytes(block_size),)


def _index_page(block_size: int) -> tuple[int, int, int]:
    return (block_size, 1, formats.INDEX_FP8.token_bytes)


class Dsv4opsCompressor:
    """Mixin for vLLM's ``DeepseekCompressor`` (attention D = 512 and indexer D = 128)."""

    def forward(self, kv_score, positions, rotary_emb):
        metadata = get_forward_context().attn_metadata
        if not routed("compressor") or not isinstance(metadata, dict):
            return super().forward(kv_score, positions, rotary_emb)
        width = self.coff * self.head_dim
        kv, score = kv_score.split([width, width], dim=-1)
        state = metadata[self.state_cache.prefix]
        entries = metadata[self.k_cache_prefix]
        view = self._static_forward_context[self.k_cache_prefix].kv_cache
        block = view.shape[1]
        n = state.slot_mapping.shape[0]
        index_keys = self.head_dim == 128
        page = _index_page(block) if index_keys else _ds_mla_page(block)
        window = PageWindow.for_slots(view, page, block, entries.slot_mapping[:n])
        call("compress_kv_insert", kv, score, positions, self.ape, self.norm.weight, _cos_sin(rotary_emb),
             self.state_cache.kv_cache, state.slot_mapping, state.block_table, state.token_to_req_indices[:n],
             window.cache, window.slots(entries.slot_mapping[:n], block),
             layout="index_fp8" if index_keys else DS_MLA, ratio=self.compress_ratio, block_size=block,
             eps=self.rms_norm_eps)
        window.write_back()


@functools.cache
def with_mixin(mixin: type, base: type) -> type:
    """The class ``base`` (vLLM's) with ``mixin`` in front, made once per pair."""
    return type(f"Dsv4ops{base.__name__}", (mixin, base), {"__module__": __name__})


def with_dsv4ops(attention_class: type) -> type:
    """vLLM's DeepSeek-V4 attention class with ``Dsv4opsAttention`` in front."""
    return with_mixin(Dsv4opsAttention, attention_class)


class Dsv4opsAttention:
    """Mixin for vLLM's ``DeepseekV4Attention`` subclasses (see the module docstring)."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        indexer_compressor = self.indexer.compressor if self.indexer is not None else None
        for compressor in (self.compressor, indexer_compressor):
            if compressor is not None:
                compressor.__class__ = with_mixin(Dsv4opsCompressor, type(compressor))
        if routed("o_proj") and not hasattr(self, "_dsv4ops_wo_a"):
            self._capture_wo_a()
        self._require_dsv4ops()

    # ---- model load ---------------------------------------------------------------------------
    def layer_config(self) -> representative.LayerConfig:
        indexer = self.indexer
        return representative.LayerConfig(
            heads=self.n_local_heads, groups=self.n_local_groups, o_lora_rank=self.o_lora_rank,
            ratio=max(self.compress_ratio, 1), window=self.window_size,
            index_heads=indexer.n_head if indexer is not None else 0,
            index_topk=indexer.topk_tokens if indexer is not None else 0, device=str(self.attn_sink.device))

    def _require_dsv4ops(self) -> None:
        """No silent fallback: every step this layer runs is served by dsv4ops or opted out."""
        cfg = self.layer_config()
        for step in representative.steps_of(cfg):
            require(step, cfg, lambda step=step: representative.BUILDERS[step](cfg))

    def _wrap_wo_a_process_weights_after_loading(self) -> None:
        """vLLM's CPU class packs ``wo_a`` for its bf16 ``bmm_cpu`` here; dsv4ops keeps it FP8."""
        if routed("o_proj"):
            self._capture_wo_a()
        else:
            super()._wrap_wo_a_process_weights_after_loading()

    def _capture_wo_a(self) -> None:
        """Keep ``wo_a`` as fp8_einsum's operands, taken when vLLM finishes loading the weight
        (before its linear method repacks it)."""
        self._dsv4ops_wo_a = self._dsv4ops_wo_a_scale = None
        method = self.wo_a.quant_method
        finish = method.process_weights_after_loading

        def capture(layer):
            scale = getattr(layer, "weight_scale_inv", getattr(layer, "weight_scale", None))
            self._dsv4ops_wo_a, self._dsv4ops_wo_a_scale = fp8_weight_blocks(
                layer.weight.data, None if scale is None else scale.data, self.n_local_groups, self.o_lora_rank)
            finish(layer)

        method.process_weights_after_loading = capture

    @classmethod
    def get_padded_num_q_heads(cls, num_heads: int) -> int:
        return num_heads          # dsv4ops takes any head count; backends pad internally

    # ---- forward steps ------------------------------------------------------------------------
    def _fused_qnorm_rope_kv_insert(self, q, kv, positions, attn_metadata):
        if not routed("insert") or not isinstance(attn_metadata, dict):
            return super()._fused_qnorm_rope_kv_insert(q, kv, positions, attn_metadata)
        swa = attn_metadata[self.swa_cache_layer.prefix]
        block = swa.block_size
        window = PageWindow.for_slots(self.swa_cache_layer.kv_cache, _ds_mla_page(block), block, swa.slot_mapping)
        call("qnorm_rope_kv_insert", q, kv, positions, _cos_sin(self.rotary_emb), window.cache,
             window.slots(swa.slot_mapping, block), layout=DS_MLA, block_size=block, eps=self.eps)
        window.write_back()
        return q

    def _sparse_indexer_and_attn(self, hidden_states, index_q, index_q_scale, index_weights, q, kv, positions,
                                 out):
        if self.indexer is None or index_q is None or not routed("indexer"):
            return super()._sparse_indexer_and_attn(hidden_states, index_q, index_q_scale, index_weights, q, kv,
                                                    positions, out)
        self._indexer_topk(index_q, index_weights, positions)
        self.forward_mqa(q, kv, positions, out)

    def _indexer_topk(self, index_q, weights, positions) -> None:
        """Fill vLLM's ``topk_indices_buffer`` with each token's request-local top-k compressed
        entries, over ``(p + 1) // ratio`` keys of its request (the causal count): decode tokens are
        rows of ``paged_mqa_topk`` over their request's key pages; prefill tokens run ``mqa_topk``
        over their requests' keys gathered into one buffer."""
        metadata = get_forward_context().attn_metadata
        keys = metadata[self.indexer.k_cache.prefix]
        swa = metadata[self.swa_cache_layer.prefix]
        tokens, decode = keys.slot_mapping.shape[0], keys.num_decode_tokens
        view = self.indexer.k_cache.kv_cache
        block = view.shape[1]
        lens = torch.div(positions[:tokens] + 1, self.compress_ratio, rounding_mode="floor").to(torch.int32)
        req = swa.token_to_req_indices[:tokens].to(torch.int64)
        table = keys.block_table[req]
        pages = table_pages(table, torch.div(lens + block - 1, block, rounding_mode="floor"), view.shape[0])
        window = PageWindow(view, pages, _index_page(block))
        table = window.block_table(table)
        topk = self.indexer.topk_tokens
        buffer = self.topk_indices_buffer
        buffer[:tokens] = -1
        if decode:
            buffer[:decode, :topk] = call("paged_mqa_topk", index_q[:decode].unsqueeze(1), window.cache,
                                          weights[:decode], lens[:decode], table[:decode],
                                          -(-self.max_model_len // self.compress_ratio), topk)
        if tokens > decode:
            rows = slice(decode, tokens)
            requests, row_request = torch.unique(req[rows], return_inverse=True)
            counts = torch.zeros(len(requests), dtype=torch.int32, device=lens.device).scatter_reduce(
                0, row_request, lens[rows], "amax")
            first_row = torch.zeros_like(requests).scatter_reduce(0, row_request, torch.arange(
                tokens - decode, device=lens.device), "amin", include_self=False)
            k, k_scale, offsets = request_keys(window.cache, table[rows][first_row], counts)
            starts = offsets[row_request].to(torch.int32)
            buffer[rows, :topk] = call("mqa_topk", index_q[rows], k, k_scale, weights[rows], starts,
                                       starts + lens[rows], topk)

    def forward_mqa(self, q, kv, positions, output) -> None:
        metadata = get_forward_context().attn_metadata
        if not routed("attention") or not isinstance(metadata, dict):
            return super().forward_mqa(q, kv, positions, output)
        swa = metadata[self.swa_cache_layer.prefix]
        tokens = q.shape[0]
        req = swa.token_to_req_indices[:tokens]
        valid = swa.is_valid_token[:tokens] if getattr(swa, "is_valid_token", None) is not None else None
        block = swa.block_size
        swa_idx, swa_lens = formats.to_global_indices(window_local(positions[:tokens], self.window_size),
                                                      swa.block_table, req, block, valid)
        main = PageWindow.for_slots(self.swa_cache_layer.kv_cache, _ds_mla_page(block), block, swa_idx)
        rows = dict(indices=main.slots(swa_idx, block), topk_lens=swa_lens)
        fixed = dict(layout=DS_MLA, block_size=block, softmax_scale=self.scale,
                     attn_sink=self.attn_sink.to(torch.float32), need_lse=False)
        if self.compress_ratio > 1:
            entries = metadata[self.prefix]
            cblock = entries.block_size // self.compress_ratio
            if self.compress_ratio == 4:
                local = self.topk_indices_buffer[:tokens]
            else:
                local = dense_compressed_local(positions[:tokens], self.compress_ratio,
                                               -(-self.max_model_len // self.compress_ratio))
            c_idx, c_lens = formats.to_global_indices(local, entries.block_table, req, cblock, valid)
            extra = PageWindow.for_slots(self.kv_cache, _ds_mla_page(cblock), cblock, c_idx)
            rows.update(extra_indices=extra.slots(c_idx, cblock), extra_topk_lens=c_lens)
            fixed.update(extra_kv_cache=extra.cache, extra_block_size=cblock)
        decode = swa.num_decode_tokens
        for op, part in (("sparse_mla_decode", slice(0, decode)), ("sparse_mla_prefill", slice(decode, tokens))):
            if part.stop > part.start:
                call(op, q[part], main.cache, out=output[part], **{k: v[part] for k, v in rows.items()}, **fixed)

    def _o_proj(self, o, positions):
        if not routed("o_proj"):
            return super()._o_proj(o, positions)
        a, a_scale = call("inv_rope_fp8_quant", o, positions, _cos_sin(self.rotary_emb), n_groups=self.n_local_groups)
        z = call("fp8_einsum", "bhr,hdr->bhd", a, a_scale, self._dsv4ops_wo_a, self._dsv4ops_wo_a_scale)
        return self.wo_b(z.flatten(1))
