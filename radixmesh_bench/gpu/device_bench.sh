#!/usr/bin/env bash
# Runs one `radixmesh bench` command on the GPU machine, from the repository root, with the
# environment of device_env.sh, then saves the compiled flashinfer kernels to $OUT:
#   OUT=/tmp/out bash radixmesh_bench/gpu/device_bench.sh serving --random-weights llama-3.1-8b ...
set -o pipefail
. radixmesh_bench/gpu/device_env.sh || exit 3
python3 -m radixmesh_bench "$@"
rc=$?
save_kernels
exit $rc
