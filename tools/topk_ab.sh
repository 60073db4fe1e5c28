#!/usr/bin/env bash
# indexer_topk A/B on one GPU machine: the bench (production, step and sweep shapes) with each
# topk_algo, then the quick and full conformance tiers with the radix path forced (the quick tier's
# short rows split into pieces of 128 columns so that they take it, and its small candidate list
# overflows on ties), each case also
# launched twice and replayed from a CUDA graph (--repeat 2: the same bits every time); each step
# under a time limit (at most 5.5 minutes in all, about 2-3 expected). From the repo root with .whl/
# carried (it sources tools/gpu_install.sh itself):
#   bash tools/topk_ab.sh OUTDIR        (OUTDIR defaults to $OUT, else /tmp/out)
set -uo pipefail
out=${1:-${OUT:-/tmp/out}}; mkdir -p "$out"; repo=$PWD
source "$repo/tools/gpu_install.sh"
{ nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; python3 -m dsv4ops.cli info; } 2>&1 | tee "$out/info.txt"
for algo in split radix; do
  DSV4OPS_TRITON_TUNING=topk_algo=$algo timeout 90 python3 -m dsv4ops.cli bench --ops indexer_topk --backends triton \
    --shapes production,step,sweep --json "$out/topk-$algo.json" 2>&1 | tee "$out/topk-$algo.txt"
done
small=topk_resident=128,topk_min_piece=32,topk_radix_piece=128,topk_radix_cap=32
for tier in quick:40 full:120; do
  limit=${tier#*:}; tier=${tier%:*}
  DSV4OPS_TRITON_TUNING=topk_algo=radix${small:+,$small} timeout $limit python3 -m dsv4ops.cli check --ops indexer_topk --backends triton \
    --tier $tier --repeat 2 --json "$out/check-radix-$tier.json" 2>&1 | tee "$out/check-radix-$tier.txt"
  small=
done
exit 0
