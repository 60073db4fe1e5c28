#!/usr/bin/env bash
# One device call: install the carried wheels, then the full conformance tier, the anchor benchmark,
# the GPU-only tests (int64 addressing, CUDA graphs, example pipeline) and the example step timing.
# .whl/ holds the vendor wheels (fetched where there is network with `python3 -m pip download --no-deps
# --only-binary=:all: --python-version 3.12 --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 -d .whl
# tokenspeed-flashmla==1.0.0.post20260615 tokenspeed-deepgemm==2.5.0.post20260604`), pytest and its
# deps, and a dsv4ops wheel built from this checkout (pip wheel . --no-deps -w .whl). From the repo root:
#   bash docs/gpu_run.sh OUTDIR          (SWEEP=1 also sweeps the Triton decode tunables)
set -uo pipefail
out=${1:-/tmp/out}; mkdir -p "$out"; repo=$PWD
source "$repo/docs/gpu_install.sh"
{ nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; python3 -m dsv4ops.cli info; } 2>&1 | tee "$out/info.txt"
python3 -m dsv4ops.cli check --tier full --backends triton,flashmla,deepgemm --json "$out/conformance_full.json" 2>&1 \
  | tee "$out/conformance_full.txt"
if [ "${OVERHEAD_ONLY:-0}" = 1 ]; then
  for i in 1 2; do python3 -m dsv4ops.cli bench --overhead --json "$out/overhead$i.json" 2>&1 | tee -a "$out/overhead.txt"; done
else
  python3 -m dsv4ops.cli bench --json "$out/bench.json" 2>&1 | tee "$out/bench.txt"
fi
python3 -m pytest -q -p no:cacheprovider "$repo/tests/test_large_addressing.py" "$repo/tests/test_cuda_graphs.py" \
  "$repo/tests/test_example.py" "$repo/tests/test_torch_ops.py" "$repo/tests/test_prepared.py" 2>&1 | tail -25 | tee "$out/pytest_gpu.txt"
python3 -m dsv4ops.examples.decode_step --device cuda --tokens 64 --heads 64 --context 4096 --time --settings \
  auto triton "sparse_mla_decode=flashmla,paged_mqa_logits=deepgemm,fp8_einsum=deepgemm,*=triton" reference 2>&1 \
  | tee "$out/example.txt"
[ "${SWEEP:-0}" = 1 ] && bash "$repo/docs/perf/sweep_decode.sh" "$out/sweep_decode.txt"
exit 0
