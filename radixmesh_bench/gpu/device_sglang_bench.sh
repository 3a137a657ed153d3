#!/usr/bin/env bash
# SGLang's own serving client against `radixmesh serve`, on the GPU machine, from the repository
# root. Each argument is one configuration (a NAME ending in _probe: greedy probe only), NAME=SERVE_FLAGS (flags with ',' for spaces are not
# supported: use ':' between flags, e.g. tp2=--gpus:0,1:--tp:2). For each: start serve with
# random Llama-3.1-8B weights (or --random-weights given in the flags), wait for its HTTP port,
# run the workloads of BENCH_WORKLOADS (default: ShareGPT, BENCH_PROMPTS prompts at rate inf,
# then a batch-1 ITL probe), stop the stack. Needs: .whl (device wheels), .sgl (SGLang's bench client copied
# from its README's folder, its wheels in .sgl/whl, the ShareGPT sample .sgl/sharegpt.json.gz).
# Results: $OUT/<NAME>.jsonl (bench_serving's lines), $OUT/<NAME>_greedy.json (greedy probe);
# serve's output in $BENCH_LOGS (default /tmp/bench_logs), its tail printed. BENCH_PORT and
# BENCH_HTTP_PORT (default 50051 and 8000; serve's internal services take the ports after
# BENCH_PORT) let several of these run side by side on disjoint GPUs (device_lanes.sh).
# BENCH_PROFILE=S: BENCH_PROFILE_AT seconds (default 10) after the ShareGPT run's main phase
# starts (the client first tokenizes its prompts for about a minute: the script waits until
# /get_server_info shows 64 running requests), py-spy records every process of the stack at once for S seconds (front doors, scheduler,
# every model-service rank) and reads its CPU time: $OUT/<NAME>_profile.json (top frames, cores
# busy). Every configuration also leaves its model services' step_burst / step_host_costs lines
# in $OUT/<NAME>_steps.log (GPU busy and idle per step, rows per step, graphed fraction).
# BENCH_CLIENTS=N (default 1): ShareGPT and GSP run as N clients at once, each with 1/N of the
# prompts (ShareGPT) or groups (GSP) and its own seed, merged into one line of $OUT/<NAME>.jsonl
# (merge_clients.py): one client process falls behind reading ~10k tokens/s of events.
set -o pipefail
. radixmesh_bench/gpu/device_env.sh || exit 3
(  # once per machine, also when lanes start together
  flock 9
  [ -f /tmp/site/.sgl_wheels ] || { python3 -m pip install -q --no-index --no-deps --no-compile \
    --target /tmp/site .sgl/whl/*.whl && touch /tmp/site/.sgl_wheels; }
) 9>/tmp/sgl_wheels.lock || exit 3
export PYTHONPATH=$PYTHONPATH:$PWD/.sgl NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
python3 -c 'import datasets' 2>/dev/null || export PYTHONPATH=$PYTHONPATH:$PWD/.sgl/stubs
[ -f /tmp/sharegpt.json ] || { gunzip -c .sgl/sharegpt.json.gz > /tmp/sharegpt.json.$$ &&
  mv /tmp/sharegpt.json.$$ /tmp/sharegpt.json; }
PORT=${BENCH_PORT:-50051}; HTTP=${BENCH_HTTP_PORT:-8000}
PROMPTS=${BENCH_PROMPTS:-2000}
# sharegpt (BENCH_PROMPTS, rate inf), gsp (SGLang's generated-shared-prefix 64 x 16, 2,048-token
# prefixes, 256 out, rate inf), itl1 (batch-1 ITL: random 128/128, one at a time), in order.
WORKLOADS=${BENCH_WORKLOADS:-sharegpt,itl1}
CLIENTS=${BENCH_CLIENTS:-1}
PROFILE_S=${BENCH_PROFILE:-0}; PROFILE_AT=${BENCH_PROFILE_AT:-10}
export PATH=/tmp/site/bin:$PATH  # py-spy, from its wheel in .whl
LOGS=${BENCH_LOGS:-/tmp/bench_logs}; mkdir -p "$LOGS"
SHAPE=${BENCH_SHAPE:-llama-3.1-8b}
TOK=$(python3 -m model_service.random_configs "$SHAPE") || exit 3
descendants() {  # every process below $1
  local c
  for c in $(pgrep -P "$1"); do echo "$c"; descendants "$c"; done
}
stop_stack() {  # $1: serve's pid. Its services run in sessions of their own (setsid), so
  # they are found as descendants, not by process group; what outlives 30 s is killed.
  local tree
  tree=$(descendants "$1")
  kill -TERM "$1" 2>/dev/null
  for _ in $(seq 1 30); do kill -0 "$1" 2>/dev/null || break; sleep 1; done
  kill -KILL "$1" $tree 2>/dev/null; wait "$1" 2>/dev/null
}
profile_stack() {  # $1: serve's pid, $2: the configuration's name
  local dir=/tmp/prof_$2 p cmd role rank tag t0 t1 cpu=()
  python3 - "$HTTP" <<'PY' || return 0  # until the main phase runs (or 300 s)
import json, sys, time, urllib.request
for _ in range(300):
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{sys.argv[1]}/get_server_info", timeout=2) as r:
            info = json.load(r)
        if sum(s.get("running_requests", 0) for s in info.get("internal_states", [])) >= 64:
            sys.exit(0)
    except OSError:
        pass
    time.sleep(1)
sys.exit(1)
PY
  sleep "$PROFILE_AT"; rm -rf "$dir"; mkdir -p "$dir"
  for p in $(descendants "$1"); do
    cmd=$(tr '\0' ' ' < "/proc/$p/cmdline" 2>/dev/null) || continue
    role=$(sed -n 's/.* -m \([a-z_]*\).*/\1/p' <<< "$cmd"); [ -n "$role" ] || continue
    rank=$(sed -n 's/.*--tp-rank \([0-9]*\).*/\1/p' <<< "$cmd")
    tag=${role}${rank:+_r$rank}_$p
    echo "$p $tag $(awk '{print $14 + $15}' "/proc/$p/stat")" >> "$dir/cpu0"
    py-spy record --pid "$p" --duration "$PROFILE_S" --rate 100 --format raw --nonblocking \
      -o "$dir/$tag.txt" > "$dir/$tag.err" 2>&1 &
  done
  wait
  while read -r p tag t0; do  # cores busy over the window, from utime + stime (clock ticks)
    t1=$(awk '{print $14 + $15}' "/proc/$p/stat" 2>/dev/null) || continue
    cpu+=(--cpu "$tag=$(python3 -c "print(round(($t1 - $t0) / $(getconf CLK_TCK) / $PROFILE_S, 2))")")
  done < "$dir/cpu0"
  python3 -m radixmesh_bench.pyspy_summary "$dir"/*.txt "${cpu[@]}" > "$OUT/$2_profile.json" \
    || { echo "profile of $2 failed"; tail -3 "$dir"/*.err; }
}
# A stack left running would hold its GPUs and ports into the next device call (setsid
# processes outlive the call): stop it also when this script is cut short (timeout's TERM).
pid=""
trap '[ -n "$pid" ] && stop_stack "$pid"; exit 124' TERM INT
status=0
for spec in "$@"; do
  name=${spec%%=*}; flags=${spec#*=}; flags=${flags//:/ }
  echo "=== $name: serve --random-weights $SHAPE $flags $(date +%T)"
  setsid python3 -m services.cli serve --random-weights "$SHAPE" --no-smoke --port "$PORT" \
    --http-port "$HTTP" --cuda-graph-max-bs 256 --max-running-requests 512 \
    --log-dir "$LOGS/$name.d" $flags \
    > "$LOGS/$name.log" 2>&1 &
  pid=$!
  ok=0
  for _ in $(seq 1 300); do
    grep -q "serving; Ctrl-C" "$LOGS/$name.log" && { ok=1; break; }
    kill -0 $pid 2>/dev/null || break
    sleep 1
  done
  grep -E "placement|ready|error|Error" "$LOGS/$name.log" | tail -5
  if [ $ok = 1 ]; then
    timeout 300 python3 radixmesh_bench/gpu/greedy_probe.py --endpoint "localhost:$PORT" --out "$OUT/${name}_greedy.json" || status=1
  fi
  if [ $ok = 1 ] && [ "${name%_probe}" = "$name" ]; then
    for wl in ${WORKLOADS//,/ }; do
      n=$CLIENTS; [ "$wl" = itl1 ] && n=1
      case $wl in
        sharegpt) data=(--dataset-name sharegpt --dataset-path /tmp/sharegpt.json --num-prompts "$((PROMPTS / n))" --request-rate inf) ;;
        gsp) data=(--dataset-name generated-shared-prefix --gsp-num-groups "$((64 / n))" --gsp-prompts-per-group 16
                   --gsp-system-prompt-len 2048 --gsp-question-len 128 --gsp-output-len 256 --request-rate inf) ;;
        itl1) data=(--dataset-name random --random-input-len 128 --random-output-len 128
                    --random-range-ratio 1 --num-prompts 4 --max-concurrency 1
                    --dataset-path /tmp/sharegpt.json) ;;  # random samples ShareGPT: no download
        *) echo "unknown workload $wl"; status=1; continue ;;
      esac
      echo "--- $name $wl $(date +%T)"
      prof=""
      if [ "$PROFILE_S" -gt 0 ] && [ "$wl" = sharegpt ]; then profile_stack "$pid" "$name" & prof=$!; fi
      if [ "$n" = 1 ]; then
        timeout 400 python3 -m sglang.bench_serving --backend sglang --host 127.0.0.1 --port "$HTTP" \
          "${data[@]}" --tokenizer "$TOK" --seed 1 --output-file "$OUT/$name.jsonl" 2>&1 \
          | grep -E "Output token throughput|Median ITL|P99 ITL|Median TTFT|Successful|Traceback|Error" || status=1
      else  # N clients at once, merged into one line
        cpids=()
        for k in $(seq 1 "$n"); do
          timeout 400 python3 -m sglang.bench_serving --backend sglang --host 127.0.0.1 --port "$HTTP" \
            "${data[@]}" --tokenizer "$TOK" --seed "$k" --output-file "$LOGS/$name.$wl.c$k.jsonl" \
            > "$LOGS/$name.$wl.c$k.txt" 2>&1 &
          cpids+=($!)
        done
        wait "${cpids[@]}" || status=1
        python3 -m radixmesh_bench.gpu.merge_clients "$LOGS/$name.$wl".c*.jsonl >> "$OUT/$name.jsonl" \
          || { status=1; tail -3 "$LOGS/$name.$wl".c*.txt; }
      fi
      [ -n "$prof" ] && wait "$prof"
    done
  fi
  if [ $ok != 1 ]; then
    echo "$name: serve did not become ready"; tail -5 "$LOGS/$name.log"; status=1
    for f in "$LOGS/$name.d"/*.log; do echo "--- $f"; grep -v "^\s*$" "$f" | tail -15; done
  fi
  grep -h "step_burst\|step_host_costs" "$LOGS/$name.d"/*.log 2>/dev/null | tail -200 > "$OUT/${name}_steps.log"
  stop_stack "$pid"; pid=""  # this stack only: a lane beside this one keeps its own
done
save_kernels
exit $status
