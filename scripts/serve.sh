#!/usr/bin/env bash
# Installs what is missing, then starts every service locally on the embedded default model
# (SmolLM2-135M-Instruct) and prints a smoke-test answer. Extra flags go to `radixmesh serve`.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install.sh
exec radixmesh serve "$@"
