#!/usr/bin/env bash
# One device call: install the carried wheels, run the full conformance tier and the anchor benchmark.
# .whl/ holds the vendor wheels (../shared/gpu/fetch-wheels.sh) and a dsv4ops wheel built from this
# checkout (pip wheel . --no-deps -w .whl). Usage from the repo root: bash docs/gpu_run.sh OUTDIR
set -uo pipefail
out=${1:-/tmp/out}; mkdir -p "$out"
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1
cd /tmp   # import the installed wheel (with its entry points), not the checkout
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$out/device.txt"
python3 -m dsv4ops.cli info 2>&1 | tee "$out/info.txt"
python3 -m dsv4ops.cli check --tier full --backends triton,flashmla,deepgemm --json "$out/conformance_full.json" 2>&1 | tee "$out/conformance_full.txt"
python3 -m dsv4ops.cli bench --json "$out/bench.json" 2>&1 | tee "$out/bench.txt"
python3 -m pytest -q -p no:cacheprovider "$OLDPWD/tests/test_large_addressing.py" 2>&1 | tail -15 | tee "$out/large_addressing.txt"
[ "${SWEEP:-0}" = 1 ] && bash "$OLDPWD/docs/perf/sweep_decode.sh" "$out/sweep_decode.txt"
