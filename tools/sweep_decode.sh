#!/usr/bin/env bash
# Sweep the Triton sparse-attention tiles on their production shapes: one `dsv4ops bench` per
# config, its lines under an "== op [config]" header (decode first, then prefill).
# Run after tools/gpu_install.sh has installed the wheels: bash tools/sweep_decode.sh LOG
log=${1:-/tmp/sweep.txt}
sweep() {
  op=$1; shift
  for cfg in "$@"; do
    echo "== $op [$cfg]"
    DSV4OPS_TRITON_TUNING=$cfg timeout 200 python3 -m dsv4ops.cli bench --ops "$op" --backends triton 2>&1 \
      | grep -E "^$op\[|rror" | sed -E 's/ +/ /g'
  done
}
{
  sweep sparse_mla_decode decode_block_k=32 decode_block_k=64 decode_block_k=128 decode_block_k=64,decode_stages=2 \
    decode_block_k=64,decode_stages=3 decode_block_k=64,decode_warps=16
  sweep sparse_mla_prefill prefill_block_k=32 prefill_block_k=64 prefill_block_k=128 prefill_block_k=64,prefill_stages=2
} | tee -a "$log"
