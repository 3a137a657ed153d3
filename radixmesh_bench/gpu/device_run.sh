#!/usr/bin/env bash
# Runs GPU benchmark parts on the GPU machine, from the repository root:
#   bash radixmesh_bench/gpu/device_run.sh check:210 test:100 decode1:140 batch64:130
# Each argument is PART[:TIMEOUT_S]. Needs the GPU wheels in .whl (see docs/gpu.md);
# reuses flashinfer kernels compiled by an earlier run when .fi_aot/fi_jit.tar.xz is present, and
# leaves this run's kernels in $OUT/fi_jit.tar.xz. Results go to $OUT/<part>.json.
set -o pipefail
OUT=${OUT:-out/gpu}
mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
  --target /tmp/site .whl/*.whl || exit 3
export PYTHONPATH=/tmp/site:$PWD:$PWD/client:${PYTHONPATH:-} PYTHONUNBUFFERED=1  # client/: the radixmesh package
export FLASHINFER_WORKSPACE_BASE=/tmp/fiws
aot=$(python3 -c 'import flashinfer, pathlib; print(pathlib.Path(flashinfer.__file__).parent / "data" / "aot")')
if [ -f .fi_aot/fi_jit.tar.xz ]; then
  mkdir -p "$aot" && tar -xJf .fi_aot/fi_jit.tar.xz -C "$aot" && echo "prebuilt kernels: $(ls "$aot" | tr '\n' ' ')"
fi
nvidia-smi --query-gpu=name,memory.used,memory.total,clocks.sm,clocks.max.sm,temperature.gpu --format=csv
python3 -c 'import torch, flashinfer, transformers; print("torch", torch.__version__, "flashinfer", flashinfer.__version__, "transformers", transformers.__version__)'

save_kernels() {  # this run's compiled kernels plus the prebuilt ones, as one tarball
  local b=/tmp/fi_bundle d so
  rm -rf $b && mkdir -p $b
  for d in "$aot" $(find /tmp/fiws -type d -name cached_ops 2>/dev/null); do
    for so in $(find "$d" -name '*.so' 2>/dev/null); do
      mkdir -p "$b/$(basename "$(dirname "$so")")" && cp "$so" "$b/$(basename "$(dirname "$so")")/"
    done
  done
  [ -n "$(ls $b)" ] || return 0
  (cd $b && tar -cf - . | xz -T0 -6 > "$OUT/fi_jit.tar.xz.tmp") && mv "$OUT/fi_jit.tar.xz.tmp" "$OUT/fi_jit.tar.xz"
  ls -la "$OUT/fi_jit.tar.xz"; du -sh $b/*
}

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
