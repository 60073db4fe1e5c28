#!/usr/bin/env bash
# One device call: install the carried wheels, then (by default) every stage below. STAGES selects
# some, to split the work over two calls: check (full conformance tier), bench (production shapes),
# overhead (dispatch overhead), tune (selection table, then the example step with it), pytest
# (GPU-only tests: int64 addressing, CUDA graphs, example pipeline, torch ops, prepared calls; vendor API drift),
# example (decode step and whole-layer prefill + decode timing per backend setting), sweep (Triton decode tunables). CHECK_OPS=a,b
# limits the check stage to those ops, SWEEP_OPS=a,b the bench sweep; TUNE_SHAPES (default production,step)
# names the shape sets tune measures.
# .whl/ holds the vendor wheels (fetched where there is network with `python3 -m pip download --no-deps
# --only-binary=:all: --python-version 3.12 --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 -d .whl
# tokenspeed-flashmla==1.0.0.post20260615 tokenspeed-deepgemm==2.5.0.post20260604`). From the repo root:
#   STAGES="check bench" bash tools/gpu_run.sh OUTDIR
set -uo pipefail
out=${1:-/tmp/out}; mkdir -p "$out"; repo=$PWD
stages=" ${STAGES:-check bench overhead tune pytest example} "
has() { [[ "$stages" == *" $1 "* ]]; }
source "$repo/tools/gpu_install.sh"
{ nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; python3 -m dsv4ops.cli info; } 2>&1 | tee "$out/info.txt"
tag=${CHECK_OPS:+-${CHECK_OPS//,/-}}                 # CHECK_OPS=a,b: only those ops (a run split over calls)
has check && python3 -m dsv4ops.cli check --tier full --backends triton,flashmla,deepgemm ${CHECK_OPS:+--ops $CHECK_OPS} \
  --json "$out/conformance_full$tag.json" 2>&1 | tee "$out/conformance_full$tag.txt"
has bench && python3 -m dsv4ops.cli bench --shapes production,step --json "$out/bench.json" 2>&1 | tee "$out/bench.txt"
has bench && python3 -m dsv4ops.cli bench --shapes sweep ${SWEEP_OPS:+--ops $SWEEP_OPS} --json "$out/bench-sweep.json" 2>&1 | tee "$out/bench-sweep.txt"
if has overhead; then
  for i in 1 2; do python3 -m dsv4ops.cli bench --overhead --json "$out/overhead$i.json" 2>&1 | tee -a "$out/overhead.txt"; done
fi
step="python3 -m dsv4ops.examples.decode_step --device cuda --tokens 64 --heads 64 --context 4096 --time --settings"
if has tune; then
  if [[ -f "$out/bench.json" ]]; then                 # this run's bench (production and step shapes): no second timing
    python3 -m dsv4ops.cli tune --from-bench "$out/bench.json" --out "$out/tuning.json" 2>&1 | tee "$out/tune.txt"
  else
    python3 -m dsv4ops.cli tune --shapes "${TUNE_SHAPES:-production,step}" --out "$out/tuning.json" 2>&1 | tee "$out/tune.txt"
  fi
  DSV4OPS_TUNING_TABLE="$out/tuning.json" $step auto triton \
    "sparse_mla_decode=flashmla,paged_mqa_logits=deepgemm,fp8_einsum=deepgemm,*=triton" 2>&1 | tee "$out/example_tuned.txt"
fi
has pytest && python3 -m pytest -q -p no:cacheprovider "$repo/tests/test_large_addressing.py" "$repo/tests/test_cuda_graphs.py" "$repo/tests/test_capture_every_op.py" \
  "$repo/tests/test_example.py" "$repo/tests/test_torch_ops.py" "$repo/tests/test_prepared.py" 2>&1 | tail -25 | tee "$out/pytest_gpu.txt"
# API drift on the GPU machine: the adapters' recorded calls bound to the installed vendor wheels
# (FlashMLA, DeepGEMM, and whatever else .whl/ carried); -rs names the ones not importable here.
has pytest && python3 -m pytest -q -rs -p no:cacheprovider "$repo/tests/test_vendor_contracts.py" \
  "$repo/tests/test_vendor_deepselect.py" -k installed 2>&1 | tail -25 | tee "$out/drift_gpu.txt"
has example && $step auto triton "sparse_mla_decode=flashmla,paged_mqa_logits=deepgemm,fp8_einsum=deepgemm,*=triton" \
  reference 2>&1 | tee "$out/example.txt"
has example && python3 -m dsv4ops.examples.layer --device cuda --time --settings auto triton \
  "sparse_mla_decode=flashmla,sparse_mla_prefill=flashmla,paged_mqa_logits=deepgemm,mqa_logits=deepgemm,fp8_einsum=deepgemm,*=triton" \
  2>&1 | tee "$out/layer.txt"
has sweep && bash "$repo/tools/sweep_decode.sh" "$out/sweep_decode.txt"
exit 0
