#!/usr/bin/env bash
# What do_not_specialize costs (issue #31): the Triton kernels' production and step shapes timed by
# `dsv4ops bench` twice on one GPU, as committed ("generic": the per-step sizes not specialized)
# and with every do_not_specialize removed ("specialized": Triton specializes those integers on
# divisibility by 16 and equality to 1, and pointers on alignment), in alternating order
# (generic, specialized, generic). From the repo root, on the GPU machine:
#   bash tools/specialization_cost.sh OUTDIR [OPS]
set -uo pipefail
out=${1:?OUTDIR}; ops=${2:-qnorm_rope_kv_insert,sparse_mla_decode,sparse_mla_prefill,paged_mqa_logits,mqa_logits,fp8_einsum,indexer_topk,compress_kv_insert,candidate_blocks,sparse_mqa_logits,paged_sparse_mqa_logits}
mkdir -p "$out"; repo=$PWD
rm -rf /tmp/specialized && cp -r "$repo"/. /tmp/specialized
python3 - /tmp/specialized/backends/triton <<'PY'
import pathlib, re, sys
for path in pathlib.Path(sys.argv[1]).glob("*.py"):
    text = path.read_text()
    new = re.sub(r"@triton\.jit\((?:do_not_specialize|\*\*_NOT_SPECIALIZED)[^)]*\)", "@triton.jit", text)
    if new != text:
        path.write_text(new)
        print("unspecialized arguments removed:", path.name)
PY
grep -n "@triton.jit(" /tmp/specialized/backends/triton/*.py && { echo "a do_not_specialize was not removed"; exit 1; }
bench() {   # $1: tree, $2: label
  (cd "$1" && source tools/gpu_install.sh && python3 -m dsv4ops.cli bench --backends triton --ops "$ops" \
     --shapes production,step --json "$out/bench-$2.json" > "$out/bench-$2.txt" 2>&1)
}
bench "$repo" generic-1 && bench /tmp/specialized specialized && bench "$repo" generic-2
python3 - "$out" <<'PY'
import json, sys
out = sys.argv[1]
def times(label):
    return {(r["op"], r["case"]): r["us"] for r in json.load(open(f"{out}/bench-{label}.json"))["results"]
            if r["backend"] == "triton" and r.get("us")}
a, s, b = times("generic-1"), times("specialized"), times("generic-2")
print(f"{'case':76} {'generic':>9} {'special.':>9} {'generic':>9} {'ratio':>6}")
for key in a:
    if key in s and key in b:
        print(f"{key[1][:76]:76} {a[key]:9.2f} {s[key]:9.2f} {b[key]:9.2f} {min(a[key], b[key]) / s[key]:6.3f}")
PY
