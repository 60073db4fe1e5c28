#!/usr/bin/env bash
# Nsight Compute on the Triton kernels at production shapes (after tools/gpu_run.sh installed the wheels):
#   PYTHONPATH=/tmp/site [OPS=fp8_einsum,indexer_topk] [LAUNCHES=12] bash tools/profile.sh OUT.txt   (OPS: only those ops' cases)
# Each case runs twice (warm-up, then the profiled launch); the software fp8 path with
# DSV4OPS_TRITON_TUNING=fp8_path=soft in the environment.
ncu --kernel-name regex:"_decode_kernel|_paged_mqa_logits_kernel|_fp8_einsum_kernel|_indexer_topk_kernel|_qnorm_rope|_inv_rope|_e4m3_decode_kernel|_threshold_kernel|_filter_kernel|_collect_kernel|_save_state|_compress|_pool|_finish" \
    --launch-skip 0 --launch-count ${LAUNCHES:-12} --clock-control none \
    --section SpeedOfLight --section Occupancy --section LaunchStats --section WarpStateStats \
    --section MemoryWorkloadAnalysis \
    python3 "$(dirname "$0")/profile_triton.py" > "${1:-/tmp/ncu.txt}" 2>&1
