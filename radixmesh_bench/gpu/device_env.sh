# Sourced by the GPU scripts on the GPU machine, from the repository root: installs the
# wheels in .whl, sets PYTHONPATH, restores flashinfer kernels compiled by an earlier run
# (.fi_aot/fi_jit.tar.xz) and defines save_kernels (this run's kernels -> $OUT/fi_jit.tar.xz).
OUT=${OUT:-out/gpu}
mkdir -p "$OUT"
# Lanes started from one call (device_lanes.sh) share one install: the first sourcing installs and
# unpacks, the rest only set the environment (two pip runs into one --target race).
if [ -z "${RADIXMESH_DEVICE_ENV_READY:-}" ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl || exit 3
fi
export PYTHONPATH=/tmp/site:$PWD:$PWD/client:${PYTHONPATH:-} PYTHONUNBUFFERED=1  # client/: the radixmesh package
export FLASHINFER_WORKSPACE_BASE=/tmp/fiws
aot=$(python3 -c 'import flashinfer, pathlib; print(pathlib.Path(flashinfer.__file__).parent / "data" / "aot")')
if [ -z "${RADIXMESH_DEVICE_ENV_READY:-}" ]; then
  if [ -f .fi_aot/fi_jit.tar.xz ]; then
    mkdir -p "$aot" && tar -xJf .fi_aot/fi_jit.tar.xz -C "$aot" && echo "prebuilt kernels: $(ls "$aot" | tr '\n' ' ')"
  fi
  nvidia-smi --query-gpu=name,memory.used,memory.total,clocks.sm,clocks.max.sm,temperature.gpu --format=csv
  python3 -c 'import torch, flashinfer, transformers; print("torch", torch.__version__, "flashinfer", flashinfer.__version__, "transformers", transformers.__version__)'
fi
export RADIXMESH_DEVICE_ENV_READY=1

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

