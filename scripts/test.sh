#!/usr/bin/env bash
# Installs what is missing, then runs the whole test suite (unit + integration on real
# processes). GPU tests skip themselves without CUDA. Extra flags go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install.sh
exec python3 -m pytest -q --durations=15 "$@"
