"""The committed stubs are exactly what the protos generate (the GPU machine cannot
regenerate them), and the client package imports without torch or transformers."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration  # starts processes or real servers

ROOT = Path(__file__).resolve().parents[2]


def test_stubs_match_protos() -> None:
    proc = subprocess.run(
        [sys.executable, str(ROOT / "protos" / "generate.py"), "--check"],
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_client_imports_without_torch() -> None:
    code = (
        "import sys; import radixmesh, radixmesh.api, radixmesh.lang; "
        "bad = [m for m in ('torch', 'transformers', 'numpy') if m in sys.modules]; "
        "assert not bad, bad"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr
