#!/usr/bin/env bash
# The Triton backend's software fp8 path (issue 25) on one GPU with FP8 tensor cores (H100), in one
# device call, from the repo root:   bash tools/run_fp8_paths.sh OUTDIR
# Stages (STAGES, default "check bench"):
#   check  the full conformance tier, Triton only, with DSV4OPS_TRITON_TUNING=fp8_path=soft forced
#          (every op; CHECK_OPS=a,b limits it, to split the run over calls):
#          OUTDIR/conformance_full_fp8soft[-ops].json / .txt
#   bench  `dsv4ops bench --shapes production`, Triton only, once as the platform chooses (the FP8
#          path on sm89+) and once with the software path forced: OUTDIR/bench_fp8hw.json,
#          OUTDIR/bench_fp8soft.json, and OUTDIR/fp8_path_ratios.txt / .json (per case: FP8-path time /
#          software-path time, so 1.0 = as fast, 0.5 = twice as slow).
# Installs this checkout as a wheel first (tools/gpu_install.sh; .whl/ may be empty: Triton only).
set -uo pipefail
out=${1:-/tmp/out}; mkdir -p "$out"; out=$(cd "$out" && pwd); repo=$PWD
stages=" ${STAGES:-check bench} "
has() { [[ "$stages" == *" $1 "* ]]; }
shopt -s nullglob                       # .whl/ (vendor wheels) may be empty or absent: Triton only
source "$repo/tools/gpu_install.sh"
soft="fp8_path=soft"
{ nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; python3 -m dsv4ops.cli info; } > "$out/info.txt" 2>&1
DSV4OPS_TRITON_TUNING=$soft python3 -c "import dsv4ops, dsv4ops.conformance; print(dsv4ops.explain('fp8_einsum', \
  **dsv4ops.conformance.typical_case('fp8_einsum').build('cuda', 0)))" 2>&1 | tee "$out/explain_fp8soft.txt"
tag=${CHECK_OPS:+-${CHECK_OPS//,/-}}
has check && DSV4OPS_TRITON_TUNING=$soft python3 -m dsv4ops.cli check --tier full --backends triton \
  ${CHECK_OPS:+--ops $CHECK_OPS} --json "$out/conformance_full_fp8soft$tag.json" 2>&1 \
  | tee "$out/conformance_full_fp8soft$tag.txt"
if has bench; then
  python3 -m dsv4ops.cli bench --shapes production --backends triton --json "$out/bench_fp8hw.json" 2>&1 \
    | tee "$out/bench_fp8hw.txt"
  DSV4OPS_TRITON_TUNING=$soft python3 -m dsv4ops.cli bench --shapes production --backends triton \
    --json "$out/bench_fp8soft.json" 2>&1 | tee "$out/bench_fp8soft.txt"
  python3 - "$out" <<'PY' 2>&1 | tee "$out/fp8_path_ratios.txt"
import json, sys
out = sys.argv[1]
rows = {path: {(r["op"], r["case"]): r for r in json.load(open(f"{out}/bench_{path}.json"))["results"]}
        for path in ("fp8hw", "fp8soft")}
ratios = []
for key, hw in rows["fp8hw"].items():
    soft = rows["fp8soft"].get(key)
    if hw.get("us") and soft and soft.get("us"):
        ratios.append(dict(op=key[0], case=key[1], fp8_us=hw["us"], soft_us=soft["us"], ratio=hw["us"] / soft["us"]))
        print(f"{key[0]:22s} {hw['us']:9.1f} us  soft {soft['us']:9.1f} us  ratio {hw['us'] / soft['us']:.2f}  {key[1]}")
json.dump(ratios, open(f"{out}/fp8_path_ratios.json", "w"), indent=1)
PY
fi
