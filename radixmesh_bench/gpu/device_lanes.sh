#!/usr/bin/env bash
# Runs several GPU jobs side by side on disjoint GPUs of one machine, from the repository root:
#   bash radixmesh_bench/gpu/device_lanes.sh \
#     'tp@0,1=bash radixmesh_bench/gpu/device_sglang_bench.sh tp1=--gpus:0 tp2=--gpus:0,1:--tp:2' \
#     'tier@2=bash radixmesh_bench/gpu/device_run.sh host_tier:520'
# Each argument is NAME@GPUS=COMMAND. A lane sees only its GPUs (CUDA_VISIBLE_DEVICES=GPUS: host
# ids, which `serve --gpus` also names), writes to $OUT/NAME (its output in $OUT/NAME/lane.log)
# and gets its own ports (BENCH_PORT 50051 + 100 * lane, BENCH_HTTP_PORT 8000 + lane), so a
# device call spends its minutes on every GPU at once. Lanes share the host's CPUs: compare
# figures within a lane, or between lanes only where the report says they ran side by side.
set -o pipefail
. radixmesh_bench/gpu/device_env.sh || exit 3
ROOT_OUT=$OUT
pids=() names=()
i=0
for spec in "$@"; do
  head=${spec%%=*}; cmd=${spec#*=}
  name=${head%%@*}; gpus=${head#*@}
  mkdir -p "$ROOT_OUT/$name"
  echo "=== lane $name on GPUs $gpus: $cmd $(date +%T)"
  (
    export CUDA_VISIBLE_DEVICES=$gpus OUT=$ROOT_OUT/$name BENCH_LOGS=/tmp/bench_logs/$name
    export BENCH_PORT=$((50051 + 100 * i)) BENCH_HTTP_PORT=$((8000 + i))
    bash -c "$cmd"
  ) > "$ROOT_OUT/$name/lane.log" 2>&1 &
  pids+=($!) names+=("$name")
  i=$((i + 1))
done
status=0
for k in "${!pids[@]}"; do
  wait "${pids[$k]}"; rc=$?
  echo "=== lane ${names[$k]} rc=$rc $(date +%T)"
  tail -40 "$ROOT_OUT/${names[$k]}/lane.log"
  [ $rc -ne 0 ] && status=1
done
exit $status
