#!/usr/bin/env bash
# The README's first command: installs what is missing into the clone's virtual environment
# (.venv: runtime dependencies only; skipped when pyproject.toml is unchanged), then starts
# every service locally on the embedded default model (SmolLM2-135M-Instruct) and prints a
# smoke-test answer. Extra flags go to `radixmesh serve` (`--port`, `--http-port`, ...).
set -euo pipefail
cd "$(dirname "$0")/.."
echo "serve.sh: installing into a virtual environment, then starting radixmesh serve" >&2
VENV=$(bash scripts/install.sh serve)
echo "serve.sh: $VENV/bin/radixmesh serve $*" >&2
exec "$VENV/bin/radixmesh" serve "$@"
