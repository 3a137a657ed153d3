#!/usr/bin/env bash
# The README's second command: installs the project with its test tools into the clone's
# virtual environment (.venv, the one serve.sh uses; pip skipped when pyproject.toml is
# unchanged), then runs the quality gates (ruff lint, ruff format check, mypy over the whole
# tree, tests included) and the whole test suite (unit + integration on real processes) with
# that environment's Python. GPU tests skip themselves without CUDA. Extra flags go to pytest.
# mypy keeps its incremental cache in .mypy_cache: about 70 s cold on two cores, 2 s warm.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=$(bash scripts/install.sh test)
# Activated, so that `python`, `radixmesh` and the tools on PATH are the environment's; tests
# start their child processes with sys.executable (tests/unit/test_suite_hygiene.py checks).
# shellcheck disable=SC1091
source "$VENV/bin/activate"
bash scripts/kubectl.sh
echo "test.sh: ruff, ruff format --check, mypy, pytest with $(command -v python)" >&2
python -m ruff check .
python -m ruff format --check .
python -m mypy .
exec python -m pytest -q --durations=15 "$@"
