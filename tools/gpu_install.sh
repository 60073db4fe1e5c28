# Sourced by the GPU scripts (tools/gpu_run.sh, tools/gpu_multi.sh) from the repo root: builds a
# dsv4ops wheel from this checkout, installs it with the carried vendor wheels (.whl/) into
# /tmp/site, and leaves the shell in /tmp so the installed wheel (with its entry points) is imported.
rm -rf build ./*.egg-info /tmp/dsv4ops-wheel /tmp/site     # a stale build/lib would shadow this checkout
python3 -m pip wheel -q --no-deps --no-build-isolation -w /tmp/dsv4ops-wheel . || exit 1
python3 -m pip install -q --no-index --no-deps --no-compile --upgrade --target /tmp/site .whl/*.whl \
  /tmp/dsv4ops-wheel/*.whl || exit 1
export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1
cd /tmp
