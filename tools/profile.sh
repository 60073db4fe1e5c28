#!/usr/bin/env bash
# Nsight Compute on the Triton kernels at production shapes (after tools/gpu_run.sh installed the wheels):
#   PYTHONPATH=/tmp/site [OPS=fp8_einsum,indexer_topk] bash tools/profile.sh OUT.txt   (OPS: only those ops' cases)
ncu --kernel-name regex:"_decode_kernel|_paged_mqa_logits_kernel|_fp8_einsum_kernel|_indexer_topk_kernel|_qnorm_rope" \
    --launch-skip 0 --launch-count 12 --clock-control none \
    --section SpeedOfLight --section Occupancy --section LaunchStats --section WarpStateStats \
    --section MemoryWorkloadAnalysis \
    python3 "$(dirname "$0")/profile_triton.py" > "${1:-/tmp/ncu.txt}" 2>&1
