"""Write deploy/requirements-cpu.txt: the installed closure of pyproject.toml's runtime
dependencies (recursively, extras followed) with exact versions. Run it in the environment the
tests pass in."""

from __future__ import annotations

import importlib.metadata as md
import re
import sys
from pathlib import Path

import tomllib
from packaging.requirements import Requirement

HEADER = """\
# The CPU image's whole runtime closure, pinned to the versions the test suite runs with
# (installed with --no-deps, so this list is exactly what the image holds; `pip check` in the
# build proves it complete). Regenerate after a dependency change: deploy/pin-requirements.py.
# The embedded default model's package is installed separately (its plugin-host deps unused).
"""


def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def closure(roots: list[str]) -> dict[str, str]:
    pins: dict[str, str] = {}
    todo: list[tuple[str, tuple[str, ...]]] = [(r, ()) for r in roots]
    while todo:
        text, extras = todo.pop()
        req = Requirement(text)
        envs = [{"extra": e} for e in ("", *extras)]
        if req.marker and not any(req.marker.evaluate(env) for env in envs):
            continue
        name = _norm(req.name)
        if name in pins:
            continue
        try:
            dist = md.distribution(req.name)
        except md.PackageNotFoundError:
            sys.exit(f"{req.name} is required but not installed")
        pins[name] = dist.version
        todo += [(r, tuple(req.extras)) for r in dist.requires or []]
    return pins


def main() -> None:
    here = Path(__file__).resolve().parent
    project = tomllib.loads((here.parent / "pyproject.toml").read_text())["project"]
    pins = closure(project["dependencies"])
    out = here / "requirements-cpu.txt"
    out.write_text(HEADER + "".join(f"{n}=={v}\n" for n, v in sorted(pins.items())))
    print(f"{out}: {len(pins)} pins")


if __name__ == "__main__":
    main()
