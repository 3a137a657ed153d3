"""Rendered Kubernetes objects of deploy/k8s and what the code says about them: the overlays
rendered with `kubectl kustomize`, the containers of every workload, and each container's
flags and RADIXMESH_* variables checked against the config dataclass of the module it runs."""

from __future__ import annotations

import argparse
import dataclasses
import functools
import os
import shutil
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from unittest import mock

import yaml

from grammar_service.config import GrammarConfig
from model_service.config import ModelServiceConfig
from scheduler_service.config import SchedulerConfig
from services.config import ENV_PREFIX, add_config_args, parse_config
from services.model_fetch import ModelFetchConfig
from tokenizer_service.config import TokenizerConfig

ROOT = Path(__file__).resolve().parents[2]
K8S = ROOT / "deploy" / "k8s"
OVERLAYS = ("cpu", "gpu", "gpu-tp")
WORKLOADS = ("Deployment", "Job")

# The module a container runs -> the config dataclass that reads its flags and environment.
CONFIGS: dict[str, type] = {
    "tokenizer_service": TokenizerConfig,
    "scheduler_service": SchedulerConfig,
    "model_service": ModelServiceConfig,
    "grammar_service": GrammarConfig,
    "services.model_fetch": ModelFetchConfig,
}
# Variables read by code other than the config dataclasses.
OTHER_ENV = {
    "RADIXMESH_CACHE",  # services.model_store.cache_root
    "HF_HOME",  # huggingface_hub / transformers cache (a writable emptyDir)
    "HF_TOKEN",  # huggingface_hub: gated model downloads
    # Tensor-parallel ranks: NVLink multicast off in NCCL, PyTorch and NVSHMEM.
    "NCCL_NVLS_ENABLE",
    "TORCH_SYMM_MEM_DISABLE_MULTICAST",
    "NVSHMEM_DISABLE_NVLS",
}


@functools.cache
def render(overlay: str) -> tuple[dict[str, Any], ...]:
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        raise RuntimeError("kubectl is not installed: run scripts/kubectl.sh")
    out = subprocess.run(
        [kubectl, "kustomize", str(K8S / "overlays" / overlay)],
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
    ).stdout
    return tuple(d for d in yaml.safe_load_all(out) if d)


def of_kind(objs: tuple[dict[str, Any], ...], kind: str) -> list[dict[str, Any]]:
    return [o for o in objs if o["kind"] == kind]


@dataclass
class Container:
    workload: dict[str, Any]
    pod: dict[str, Any]  # the pod spec
    spec: dict[str, Any]
    init: bool

    @property
    def where(self) -> str:
        return f"{self.workload['kind']}/{self.workload['metadata']['name']}:{self.spec['name']}"

    @property
    def module(self) -> str:
        cmd = self.spec.get("command", [])
        if len(cmd) >= 3 and cmd[0] == "python" and cmd[1] == "-m":
            return str(cmd[2])
        raise AssertionError(f"{self.where}: command must be `python -m MODULE`, got {cmd}")

    @property
    def flags(self) -> list[str]:
        return list(self.spec.get("command", [])[3:]) + list(self.spec.get("args", []))

    def env(self) -> dict[str, str]:
        return {e["name"]: str(e.get("value", "")) for e in self.spec.get("env", [])}


def containers(objs: tuple[dict[str, Any], ...]) -> Iterator[Container]:
    for w in objs:
        if w["kind"] not in WORKLOADS:
            continue
        pod = w["spec"]["template"]["spec"]
        for c in pod.get("initContainers", []):
            yield Container(w, pod, c, True)
        for c in pod["containers"]:
            yield Container(w, pod, c, False)


def config_problems(c: Container) -> list[str]:
    """What the code would not understand: an unknown module, a flag its parser rejects, a
    RADIXMESH_* variable no config field reads, or a value its config refuses."""
    cls = CONFIGS.get(c.module)
    if cls is None:
        return [f"{c.where}: no config known for module {c.module}"]
    problems = []
    fields = {ENV_PREFIX + f.name.upper() for f in dataclasses.fields(cls)}
    for name in c.env():
        if name not in fields and name not in OTHER_ENV:
            problems.append(f"{c.where}: env {name} is read by nothing in {c.module}")
    parser = argparse.ArgumentParser(exit_on_error=False)
    add_config_args(parser, cls)
    try:
        ns, unknown = parser.parse_known_args(c.flags)
    except argparse.ArgumentError as exc:
        return [*problems, f"{c.where}: {exc}"]
    if unknown:
        problems.append(f"{c.where}: flags {unknown} are unknown to {c.module}")
    return problems


def parsed_config(c: Container) -> Any:
    """The container's config exactly as its service would build it at start: flags and
    RADIXMESH_* variables through the same parser, then the config's own validation."""
    env = {k: v for k, v in c.env().items() if k.startswith(ENV_PREFIX)}
    clean = {k: v for k, v in os.environ.items() if not k.startswith(ENV_PREFIX)}
    with mock.patch.dict(os.environ, {**clean, **env}, clear=True):
        return parse_config(CONFIGS[c.module], c.flags)


PLACEHOLDER = K8S / "secrets-placeholder.yaml"


def placeholder_secrets() -> dict[str, dict[str, Any]]:
    """The committed placeholder Secrets by name (deploy/k8s/secrets-placeholder.yaml)."""
    docs = [d for d in yaml.safe_load_all(PLACEHOLDER.read_text()) if d]
    return {d["metadata"]["name"]: d for d in docs}


def secret_mounts(c: Container) -> dict[str, str]:
    """mountPath -> Secret name, for each Secret volume the container mounts."""
    volumes = {
        v["name"]: v["secret"]["secretName"] for v in c.pod.get("volumes", []) if "secret" in v
    }
    return {
        m["mountPath"]: volumes[m["name"]]
        for m in c.spec.get("volumeMounts", [])
        if m["name"] in volumes
    }


def secret_file(c: Container, path: str) -> tuple[str, str] | None:
    """(Secret name, key) of a file path inside one of the container's Secret mounts."""
    for mount, secret in secret_mounts(c).items():
        if path.startswith(mount.rstrip("/") + "/"):
            return secret, path[len(mount.rstrip("/")) + 1 :]
    return None
