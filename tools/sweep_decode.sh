#!/usr/bin/env bash
# Sweep the Triton decode tunables on the anchor shapes (one line per config and shape).
# Run after tools/gpu_run.sh has installed the wheels: PYTHONPATH=/tmp/site bash tools/sweep_decode.sh LOG
log=${1:-/tmp/sweep.txt}
for cfg in decode_block_h=32,decode_block_k=32,decode_warps=8 \
           decode_block_h=64,decode_block_k=32,decode_warps=8 \
           decode_block_h=64,decode_block_k=16,decode_warps=8 \
           decode_block_h=64,decode_block_k=32,decode_warps=16 \
           decode_block_h=32,decode_block_k=64,decode_warps=8 \
           decode_block_h=16,decode_block_k=32,decode_warps=4 \
           decode_block_h=32,decode_block_k=32,decode_warps=8,decode_stages=2 \
           decode_block_h=64,decode_block_k=32,decode_warps=8,decode_stages=2; do
  echo "== $cfg" | tee -a "$log"
  DSV4OPS_TRITON_TUNING=$cfg timeout 120 python3 -m dsv4ops.cli bench --ops sparse_mla_decode --backends triton 2>&1 \
    | grep -E "us$|Error|error" | tee -a "$log"
done
