"""A tiny random-weight DeepSeek-V4 checkpoint that vLLM's CPU model loads (config.json + model.safetensors).

Four layers, one per attention kind the CPU path has: 0 sliding window only (hash-routed MoE), 1 and 3
ratio 4 with the lightning indexer, 2 ratio 128. The CPU kernels fix most sizes: head_dim 512 with RoPE
64, index_head_dim 128 with index_topk 512, bf16, 64 experts with top-6 routing. Weights are in the
native DeepSeek naming that vLLM's loader maps (``hf_to_vllm_mapper``); it fails on any missing one.
"""
from __future__ import annotations

import json
from pathlib import Path

import torch

CONFIG = dict(
    architectures=["DeepseekV4ForCausalLM"], bos_token_id=0, eos_token_id=1, torch_dtype="bfloat16",
    vocab_size=512, hidden_size=256, moe_intermediate_size=128,
    num_hidden_layers=4, num_attention_heads=16, num_key_value_heads=1,
    head_dim=512, qk_rope_head_dim=64, q_lora_rank=128, o_lora_rank=128, o_groups=4,
    hidden_act="silu", swiglu_limit=10.0, rms_norm_eps=1e-6,
    max_position_embeddings=4096, sliding_window=128,
    rope_theta=10000, compress_rope_theta=160000,
    rope_scaling={"type": "yarn", "rope_type": "yarn", "factor": 16,
                  "original_max_position_embeddings": 256, "beta_fast": 32, "beta_slow": 1},
    compress_ratios=[0, 4, 128, 4],
    index_n_heads=64, index_head_dim=128, index_topk=512,
    hc_mult=4, hc_sinkhorn_iters=20, hc_eps=1e-6,
    n_routed_experts=64, n_shared_experts=1, num_experts_per_tok=6, norm_topk_prob=True,
    routed_scaling_factor=1.5, scoring_func="sqrtsoftplus", topk_method="noaux_tc",
    num_hash_layers=1, num_nextn_predict_layers=0, tie_word_embeddings=False,
)
WINDOW = CONFIG["sliding_window"]
INDEXER_REACH = 4 * CONFIG["index_topk"]       # tokens a ratio-4 layer covers before its top-k selects


def weight_shapes(cfg: dict) -> dict[str, tuple[tuple[int, ...], torch.dtype, str]]:
    """name -> (shape, dtype, init) with init one of normal (std 0.02), embed (std 1), one, zero,
    tid2eid (per token id a random choice of distinct experts)."""
    H, V, hc = cfg["hidden_size"], cfg["vocab_size"], cfg["hc_mult"]
    nh, hd, ql, ol, og = (cfg[k] for k in ("num_attention_heads", "head_dim", "q_lora_rank", "o_lora_rank", "o_groups"))
    E, I, k = cfg["n_routed_experts"], cfg["moe_intermediate_size"], cfg["num_experts_per_tok"]
    ih, ihd = cfg["index_n_heads"], cfg["index_head_dim"]
    bf16, f32 = torch.bfloat16, torch.float32
    w = {"embed.weight": ((V, H), bf16, "embed"), "head.weight": ((V, H), bf16, "normal"),
         "norm.weight": ((H,), bf16, "one"), "hc_head_fn": ((hc, hc * H), f32, "normal"),
         "hc_head_base": ((hc,), f32, "zero"), "hc_head_scale": ((1,), f32, "one")}
    for i, ratio in enumerate(cfg["compress_ratios"][: cfg["num_hidden_layers"]]):
        p = f"layers.{i}."
        w[p + "attn_norm.weight"] = ((H,), bf16, "one")
        w[p + "ffn_norm.weight"] = ((H,), bf16, "one")
        for part in ("attn", "ffn"):
            w[p + f"hc_{part}_fn"] = (((2 + hc) * hc, hc * H), f32, "normal")
            w[p + f"hc_{part}_base"] = (((2 + hc) * hc,), f32, "zero")
            w[p + f"hc_{part}_scale"] = ((3,), f32, "one")
        a = p + "attn."
        w[a + "attn_sink"] = ((nh,), f32, "zero")
        w[a + "wq_a.weight"] = ((ql, H), bf16, "normal")
        w[a + "wkv.weight"] = ((hd, H), bf16, "normal")
        w[a + "q_norm.weight"] = ((ql,), bf16, "one")
        w[a + "kv_norm.weight"] = ((hd,), bf16, "one")
        w[a + "wq_b.weight"] = ((nh * hd, ql), bf16, "normal")
        w[a + "wo_a.weight"] = ((og * ol, nh * hd // og), bf16, "normal")
        w[a + "wo_b.weight"] = ((H, og * ol), bf16, "normal")
        if ratio:
            coff = 2 if ratio == 4 else 1
            _compressor(w, a + "compressor.", ratio, coff * hd, hd, H)
        if ratio == 4:
            w[a + "indexer.wq_b.weight"] = ((ih * ihd, ql), bf16, "normal")
            w[a + "indexer.weights_proj.weight"] = ((ih, H), bf16, "normal")
            _compressor(w, a + "indexer.compressor.", ratio, 2 * ihd, ihd, H)
        f = p + "ffn."
        w[f + "gate.weight"] = ((E, H), bf16, "normal")
        if i < cfg["num_hash_layers"]:
            w[f + "gate.tid2eid"] = ((V, k), torch.int32, "tid2eid")
        else:
            w[f + "gate.bias"] = ((E,), f32, "zero")
        for e in [*(f"experts.{e}." for e in range(E)), "shared_experts."]:
            w[f + e + "w1.weight"] = ((I, H), bf16, "normal")
            w[f + e + "w3.weight"] = ((I, H), bf16, "normal")
            w[f + e + "w2.weight"] = ((H, I), bf16, "normal")
    return w


def _compressor(w: dict, prefix: str, ratio: int, width: int, head_dim: int, hidden: int):
    w[prefix + "wkv.weight"] = ((width, hidden), torch.bfloat16, "normal")
    w[prefix + "wgate.weight"] = ((width, hidden), torch.bfloat16, "normal")
    w[prefix + "ape"] = ((ratio, width), torch.float32, "normal")
    w[prefix + "norm.weight"] = ((head_dim,), torch.bfloat16, "one")


def random_weights(cfg: dict, seed: int) -> dict[str, torch.Tensor]:
    """The weights of ``weight_shapes`` drawn from one seeded generator, in name order."""
    gen = torch.Generator().manual_seed(seed)
    out = {}
    for name, (shape, dtype, init) in sorted(weight_shapes(cfg).items()):
        if init == "normal":
            t = torch.randn(shape, generator=gen) * 0.02
        elif init == "embed":
            t = torch.randn(shape, generator=gen)
        elif init == "tid2eid":
            t = torch.stack([torch.randperm(cfg["n_routed_experts"], generator=gen)[: shape[1]] for _ in range(shape[0])])
        else:
            t = torch.full(shape, 1.0 if init == "one" else 0.0)
        out[name] = t.to(dtype).contiguous()
    return out


def write_checkpoint(folder: Path, seed: int = 0) -> Path:
    """Write config.json (through vLLM's DeepseekV4Config) and model.safetensors into ``folder``."""
    from safetensors.torch import save_file
    from vllm.transformers_utils.configs.deepseek_v4 import DeepseekV4Config

    folder.mkdir(parents=True, exist_ok=True)
    DeepseekV4Config(**CONFIG).save_pretrained(folder)
    save_file(random_weights(CONFIG, seed), str(folder / "model.safetensors"))
    (folder / "generation_config.json").write_text(json.dumps(
        {"bos_token_id": CONFIG["bos_token_id"], "eos_token_id": CONFIG["eos_token_id"]}))
    return folder
