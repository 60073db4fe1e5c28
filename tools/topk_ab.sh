#!/usr/bin/env bash
# indexer_topk A/B on one GPU machine: the bench (production, step and sweep shapes) with each
# topk_algo, then the quick and full conformance tiers with the radix path forced, each case also
# launched twice and replayed from a CUDA graph (--repeat 2: the same bits every time). From the
# repo root, after nothing else (it sources tools/gpu_install.sh):
#   bash tools/topk_ab.sh OUTDIR        (OUTDIR defaults to $OUT, else /tmp/out)
set -uo pipefail
out=${1:-${OUT:-/tmp/out}}; mkdir -p "$out"; repo=$PWD
source "$repo/tools/gpu_install.sh"
{ nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; python3 -m dsv4ops.cli info; } 2>&1 | tee "$out/info.txt"
for algo in split radix; do
  DSV4OPS_TRITON_TUNING=topk_algo=$algo python3 -m dsv4ops.cli bench --ops indexer_topk --backends triton \
    --shapes production,step,sweep --json "$out/topk-$algo.json" 2>&1 | tee "$out/topk-$algo.txt"
done
for tier in quick full; do
  DSV4OPS_TRITON_TUNING=topk_algo=radix python3 -m dsv4ops.cli check --ops indexer_topk --backends triton \
    --tier $tier --repeat 2 --json "$out/check-radix-$tier.json" 2>&1 | tee "$out/check-radix-$tier.txt"
done
exit 0
