"""`import radixmesh` is the installed package from any working folder (issue 30 item 4): run
from the folder that holds the clone (a clone is named `radixmesh` by default), Python used to
import the clone's folder as a namespace package (`module 'radixmesh' has no attribute
'Client'`). scripts/install.sh installs in setuptools' compat editable mode (path entries), so
the real package, a regular one, wins over a namespace folder in the working directory."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = "import radixmesh, sys; radixmesh.Client; print(radixmesh.__file__)"

pytestmark = pytest.mark.integration  # starts a process


def _run_from(folder: Path) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}  # as a user would
    return subprocess.run(
        [sys.executable, "-c", SCRIPT], cwd=folder, env=env, capture_output=True, text=True
    )


def test_import_from_a_folder_holding_a_clone_named_radixmesh(tmp_path: Path) -> None:
    clone = tmp_path / "radixmesh"  # `git clone .../radixmesh` makes this
    for part in ("client/radixmesh", "services", "tokenizer_service"):
        (clone / part).mkdir(parents=True)
    out = _run_from(tmp_path)
    assert out.returncode == 0, out.stderr
    assert Path(out.stdout.strip()) == ROOT / "client" / "radixmesh" / "__init__.py"


def test_import_from_the_clones_parent_folder() -> None:
    out = _run_from(ROOT.parent)
    assert out.returncode == 0, out.stderr
    assert Path(out.stdout.strip()) == ROOT / "client" / "radixmesh" / "__init__.py"
