"""The repository stands alone (issue 11): no file refers to anything outside it (the design
notes it once pointed at are folded into docs/architecture.md), the README lists every example,
and the examples are installed with the client package."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "client" / "radixmesh" / "examples"
SKIP_DIRS = {".git", "__pycache__", ".mypy_cache", ".ruff_cache", ".pytest_cache", ".hypothesis"}
SKIP_DIRS |= {"build", "dist", ".whl", ".cache", "out"}
# Spelled in pieces so that this file does not match itself.
OUTSIDE = [".." + "/shared", "DESIGN" + ".md"]


def _text_files() -> list[Path]:
    out = []
    for path in ROOT.rglob("*"):
        rel = path.relative_to(ROOT)
        if not path.is_file() or SKIP_DIRS & set(rel.parts) or rel.parts[0].endswith(".egg-info"):
            continue
        # Raw logs of past GPU runs are kept verbatim, as recorded.
        if rel.parts[0] == "results" and path.suffix == ".txt":
            continue
        data = path.read_bytes()
        if b"\0" in data[:4096]:
            continue  # binary
        out.append(path)
    return out


def test_no_file_refers_outside_the_repository() -> None:
    files = _text_files()
    assert any(p.name == "README.md" for p in files) and len(files) > 100
    hits = []
    for path in files:
        text = path.read_text(errors="replace")
        for n, line in enumerate(text.splitlines(), 1):
            if any(needle in line for needle in OUTSIDE):
                hits.append(f"{path.relative_to(ROOT)}:{n}: {line.strip()[:120]}")
    assert not hits, "references outside the repository:\n" + "\n".join(hits)


def test_readme_lists_every_example() -> None:
    readme = (ROOT / "README.md").read_text()
    listed = set(re.findall(r"^\| `(\w+)` \|", readme, flags=re.M))
    examples = {p.stem for p in EXAMPLES.glob("*.py") if not p.stem.startswith("_")}
    assert examples <= listed, f"not in README: {sorted(examples - listed)}"
    assert "python -m radixmesh.examples.NAME" in readme


@pytest.mark.integration  # starts a process
def test_examples_ship_in_the_client_wheel(tmp_path: Path) -> None:
    # Build from a copy (setuptools writes build/ and egg-info next to the sources); the
    # client's pyproject takes radixmesh_wire from ../radixmesh_wire.
    shutil.copytree(ROOT / "client", tmp_path / "client", ignore=shutil.ignore_patterns("build"))
    shutil.copytree(ROOT / "radixmesh_wire", tmp_path / "radixmesh_wire")
    out = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q"]
        + ["-w", str(tmp_path / "dist"), str(tmp_path / "client")],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr
    (wheel,) = (tmp_path / "dist").glob("radixmesh_client-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    for example in EXAMPLES.glob("*.py"):
        assert f"radixmesh/examples/{example.name}" in names
    assert "radixmesh/api.py" in names and "radixmesh_wire/pb/api_pb2.py" in names
    assert not any(n.startswith(("services/", "radixmesh_bench/")) for n in names)
