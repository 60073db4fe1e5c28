#!/usr/bin/env bash
# Multi-GPU device test (two GPUs): every op with its tensors on a GPU other than the current one.
# Installs the carried vendor wheels (.whl/) and this checkout, then runs tests/test_devices.py (the quick
# conformance tier on cuda:1 with cuda:0 current and the reverse, every available backend) and the same
# through the CLI. From the repo root:  bash tools/gpu_multi.sh OUTDIR
set -uo pipefail
out=${1:-/tmp/out}; mkdir -p "$out"; repo=$PWD
source "$repo/tools/gpu_install.sh"
{ nvidia-smi -L; python3 -c 'import torch, triton; print("torch", torch.__version__, "triton", triton.__version__)'
  python3 -m dsv4ops.cli info | head -12 || true; } 2>&1 | tee "$out/multi_gpu_info.txt"
python3 -m pytest -v -p no:cacheprovider "$repo/tests/test_devices.py" 2>&1 | tail -15 | tee "$out/multi_gpu_pytest.txt"
for target in 0 1; do
  current=$((1 - target))
  python3 -c "import sys, torch; torch.cuda.set_device($current); from dsv4ops.cli import main; \
print('current device', torch.cuda.current_device()); sys.exit(main(['check', '--device', 'cuda:$target', \
'--backends', 'triton,flashmla,deepgemm,reference']))" 2>&1 | tee "$out/multi_gpu_check_cuda$target.txt"
done
