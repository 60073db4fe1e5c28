#!/usr/bin/env bash
# One device call: install the vendor wheels, run the full conformance tier and the anchor benchmark.
# Usage on the GPU machine (from the repo root, with .whl/ carried): bash docs/gpu_run.sh OUTDIR
set -uo pipefail
out=${1:-/tmp/out}; mkdir -p "$out"
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site:$PWD
python3 -m pip install -q --no-deps --no-build-isolation --no-index -e . >/dev/null 2>&1 || true
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$out/device.txt"
python3 -m dsv4ops.cli info 2>&1 | tee "$out/info.txt"
python3 -m dsv4ops.cli check --tier full --backends triton,flashmla,deepgemm --json "$out/conformance_full.json" 2>&1 | tee "$out/conformance_full.txt"
python3 -m dsv4ops.cli bench --json "$out/bench.json" 2>&1 | tee "$out/bench.txt"
