#!/usr/bin/env bash
# Runs GPU benchmark parts on the GPU machine, from the repository root:
#   bash radixmesh_bench/gpu/device_run.sh check:210 test:100 decode1:140 batch64:130
# Each argument is PART[:TIMEOUT_S]. Needs the GPU wheels in .whl (see docs/gpu.md);
# reuses flashinfer kernels compiled by an earlier run when .fi_aot/fi_jit.tar.xz is present, and
# leaves this run's kernels in $OUT/fi_jit.tar.xz. Results go to $OUT/<part>.json.
set -o pipefail
. radixmesh_bench/gpu/device_env.sh || exit 3

status=0
for spec in "$@"; do
  part=${spec%%:*}
  limit=${spec#*:}; [ "$limit" = "$spec" ] && limit=480
  echo "=== $part (limit ${limit}s) $(date +%T)"
  timeout "$limit" python3 radixmesh_bench/gpu/run.py --part "$part" --out "$OUT"
  rc=$?; echo "=== $part rc=$rc $(date +%T)"; [ $rc -ne 0 ] && status=1
  case $part in check|test|profile) save_kernels ;; esac
done
python3 radixmesh_bench/gpu/merge.py "$OUT"/*.json
exit $status
