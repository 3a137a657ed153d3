"""The client library must import and run with grpcio + protobuf only."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration  # starts processes or real servers

ROOT = Path(__file__).resolve().parents[2]

SCRIPT = """
import sys
for heavy in ("torch", "numpy", "transformers", "tqdm"):
    sys.modules[heavy] = None  # any import of these now raises ImportError
import radixmesh as rm

@rm.function
def prog(s, x):
    s += "Q: " + x + rm.gen("a")
    forks = s.fork(2)
    forks += rm.select("c", [" yes", " no"])

state = prog.run(x="hi", backend=rm.ScriptedBackend())
state.wait()
assert state.text() == "Q: hiok", state.text()
heavy = ("torch", "numpy", "transformers")
print(sorted(m for m, mod in sys.modules.items() if mod and m.split(".")[0] in heavy))
"""


def test_client_imports_without_heavy_dependencies() -> None:
    out = subprocess.run(
        [sys.executable, "-c", SCRIPT],
        cwd=ROOT,
        env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"
