#!/usr/bin/env bash
# kubectl (>= 1.27, for `kubectl kustomize` with kustomize v5) renders deploy/k8s in the deploy
# tests (test.sh only; serving needs none). Skipped when a recent one is on PATH. Debian's own
# `kubernetes-client` (1.20) bundles a kustomize too old for the overlays, so the package is
# `kubectl` from the Kubernetes or Google Cloud apt repository, whichever this machine has
# configured; without one the deploy tests that need it skip themselves.
set -euo pipefail
kubectl_ok() {
  command -v kubectl >/dev/null 2>&1 || return 1
  local minor
  minor=$(kubectl version --client -o json 2>/dev/null \
    | python3 -c "import json,sys; print(json.load(sys.stdin)['clientVersion']['minor'].rstrip('+'))" \
    2>/dev/null) || return 1
  [ "${minor:-0}" -ge 27 ]
}
if ! kubectl_ok; then
  SUDO=""
  [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  if apt-cache show kubectl >/dev/null 2>&1; then
    echo "kubectl.sh: installing kubectl (apt)" >&2
    $SUDO apt-get install -y -q kubectl >/dev/null
  else
    echo "kubectl.sh: kubectl >= 1.27 not found and no apt repository offers it;" \
      "see https://kubernetes.io/docs/tasks/tools/ (the deploy tests need it)" >&2
  fi
fi
