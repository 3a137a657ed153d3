"""The images' pinned requirement files hold every runtime dependency of the project: the CPU
image installs requirements-cpu.txt with --no-deps, so a dependency missing there is missing in
the image (the HTTP API's aiohttp and mTLS's cryptography once were)."""

from __future__ import annotations

import re

import tomllib
from packaging.requirements import Requirement

from tests.deploy.manifests import ROOT

DEPLOY = ROOT / "deploy"
CUDA_ONLY = {"torch", "flashinfer-python", "flashinfer-cubin", "flashinfer-jit-cache"}


def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _pins(path: str) -> dict[str, str]:
    out = {}
    for line in (DEPLOY / path).read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            name, _, version = line.partition("==")
            assert version, f"{path}: {line!r} is not pinned with =="
            out[_norm(name)] = version
    return out


def test_every_runtime_dependency_is_pinned_in_both_images() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    wanted = {_norm(Requirement(r).name) for r in project["dependencies"]}
    cpu, cuda = _pins("requirements-cpu.txt"), _pins("requirements-cuda.txt")
    assert wanted - set(cpu) == set()
    assert wanted - set(cuda) == set()


def test_cuda_pins_are_the_cpu_pins_but_torch() -> None:
    cpu, cuda = _pins("requirements-cpu.txt"), _pins("requirements-cuda.txt")
    shared = {n: v for n, v in cpu.items() if n not in ("torch", "triton")}
    assert {n: v for n, v in cuda.items() if n not in CUDA_ONLY} == shared
