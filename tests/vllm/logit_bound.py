"""The bound on |logit(plugin) - logit(vLLM's CPU kernels)| the end-to-end test holds, from the ops' rules.

Per attention layer, the plugin's branch output (the o-projection's, before the residual add) differs
from vLLM's by independent rounding-sized errors, each relative to that output (RMS over its elements):
  - the o-projection runs in FP8 where vLLM's CPU path keeps bf16: inv_rope_fp8_quant rounds the
    activations to e4m3 and the wo_a weights are e4m3 too; rounding to a grid of relative spacing 2^-3
    (3 mantissa bits) leaves an error uniform within half a step: RMS 2^-3/sqrt(12) each;
  - the KV, compressed and indexer-key caches: both sides store e4m3, and the insert and compressor rules
    allow one e4m3 step where a bf16 input differs by an ulp: counted once more as 2^-3/sqrt(12);
  - sparse attention: the attention rule's relative tolerance 2.01/128; fp8_einsum: one bf16 ulp 2^-7.
  eps_layer = sqrt(3 (2^-3/sqrt(12))^2 + (2.01/128)^2 + (2^-7)^2) = 0.0649.
The L attention layers' errors are independent: sqrt(L) eps_layer for the final hidden state, assuming
each branch is no larger than the residual stream it is added to and the later layers and the mHC head
do not amplify a relative error (the final RMSNorm does not: to first order it projects the error
orthogonally to the state). The normed state h has norm sqrt(H) max|norm weight| at most, so
||dh|| <= sqrt(L) eps_layer sqrt(H) g. A logit is W_v . h; dh's direction is independent of W_v, so
|dlogit_v| ~ ||W_v|| ||dh|| / sqrt(H) |N(0, 1)|, bounded at Z = 5 standard deviations (about 6e-7 of the
~10^4 logits compared exceed it if the model is right):
  BOUND = Z sqrt(L) eps_layer g max_v ||W_v||.
The top-two margin of a row moves by (W_v1 - W_v2) . dh, with ||W_v1 - W_v2|| <= sqrt(2) max ||W_v|| for
independent rows: greedy tokens agree where vLLM's margin exceeds sqrt(2) BOUND.
"""
from __future__ import annotations

import math

import torch

E4M3_ROUNDING_RMS = 2 ** -3 / math.sqrt(12)
ATTENTION_RTOL = 2.01 / 128
BF16_ULP = 2 ** -7
EPS_LAYER = math.sqrt(3 * E4M3_ROUNDING_RMS ** 2 + ATTENTION_RTOL ** 2 + BF16_ULP ** 2)
Z = 5.0


def logit_bound(weights: dict[str, torch.Tensor], config: dict) -> float:
    """BOUND for the checkpoint's head and final norm (``weights``: name -> tensor) and ``config``."""
    layers = config["num_hidden_layers"]
    head_row_norm = float(weights["head.weight"].float().norm(dim=1).max())
    norm_gain = float(weights["norm.weight"].float().abs().max())
    return Z * math.sqrt(layers) * EPS_LAYER * norm_gain * head_row_norm


MARGIN_FACTOR = math.sqrt(2)     # greedy tokens must agree where the top-two margin > MARGIN_FACTOR * BOUND
