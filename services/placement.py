"""GPU placement for `radixmesh serve --gpus G --tp T --replicas R`: which GPUs each replica's
tensor-parallel ranks get. Pure (the caller says which GPUs are visible), so every rule is
unit-tested; the model services themselves check that their shard fits (model_service
preflight), since only they know the model.

Rules:
- GPUs: `--gpus` (ids as CUDA numbers them on this host), else every visible GPU.
- Neither T nor R: one replica per GPU at T = 1 (the highest throughput for a model that fits
  one GPU: no collectives); T alone: as many replicas as fit (G // T); R alone: the GPUs
  split evenly (T = G // R); both: T * R GPUs must be there.
- Replica i takes GPUs [i*T, (i+1)*T) of the list: neighbours, which on the usual hosts share
  a switch or NVLink. GPUs left over are named in the note, never silently used.
- No GPU at all: the CPU, T and R as given (default 1 each); rank processes share the cores.
Refusals are `ValueError`s that name the numbers. `visible_gpus()` finds the host's GPU ids
without torch (CUDA_VISIBLE_DEVICES, else nvidia-smi).
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

# Every process of a multi-GPU replica keeps NVLink multicast off (the machines require it):
# in NCCL, PyTorch's symmetric memory and NVSHMEM (model_service.tp.comm sets the same).
NCCL_ENV = {
    "NCCL_NVLS_ENABLE": "0",
    "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
    "NVSHMEM_DISABLE_NVLS": "1",
}


@dataclass(frozen=True)
class Placement:
    tp: int
    replicas: tuple[tuple[int, ...], ...]  # per replica: its ranks' GPU ids, rank order ((): CPU)
    note: str  # what was chosen, for the log line at start-up

    def env(self, i: int) -> dict[str, str]:
        """Environment of replica i's model service: its GPUs only, rank r on visible GPU r."""
        ids = self.replicas[i]
        if not ids:
            return {}
        return {"CUDA_VISIBLE_DEVICES": ",".join(map(str, ids)), **NCCL_ENV}

    def replica_envs(self) -> tuple[dict[str, str], ...]:
        """Every replica's `env`, in order: `launcher.Topology(replica_env=...)` as it is."""
        return tuple(self.env(i) for i in range(len(self.replicas)))

    def model_args(self) -> list[str]:
        """Flags every replica's model service gets (the same for all replicas)."""
        return ["--tp", str(self.tp)] if self.tp > 1 else []


def _check_gpus(gpus: Sequence[int], visible: Sequence[int]) -> None:
    if len(set(gpus)) != len(gpus):
        raise ValueError(f"--gpus {_ids(gpus)} names a GPU twice")
    missing = [g for g in gpus if g not in visible]
    if missing:
        seen = _ids(visible) if visible else "none"
        raise ValueError(f"--gpus {_ids(gpus)}: GPU {missing[0]} is not visible (visible: {seen})")


def _ids(ids: Sequence[int]) -> str:
    return ",".join(map(str, ids))


def _sizes(n: int, tp: int | None, replicas: int | None) -> tuple[int, int]:
    """(tp, replicas) for n GPUs, or ValueError naming the numbers."""
    for name, v in (("--tp", tp), ("--replicas", replicas)):
        if v is not None and v < 1:
            raise ValueError(f"{name} must be at least 1 (got {v})")
    if tp is None and replicas is None:
        return 1, n
    if tp is None:
        assert replicas is not None
        if replicas > n:
            raise ValueError(f"--replicas {replicas} needs at least {replicas} GPUs; {n} given")
        return n // replicas, replicas
    if replicas is None:
        if tp > n:
            raise ValueError(f"--tp {tp} needs {tp} GPUs per replica; only {n} given")
        return tp, n // tp
    if tp * replicas > n:
        raise ValueError(
            f"--tp {tp} x --replicas {replicas} needs {tp * replicas} GPUs; only {n} given"
        )
    return tp, replicas


def plan_placement(
    visible: Sequence[int],
    gpus: Sequence[int] | None = None,
    tp: int | None = None,
    replicas: int | None = None,
) -> Placement:
    """Where each replica's ranks run. `visible`: the GPU ids on this host ([] without CUDA);
    `gpus`: `--gpus` (None: all visible); `tp`, `replicas`: as given (None: not given)."""
    if not visible and not gpus:
        t, r = tp or 1, replicas or 1
        if t < 1 or r < 1:
            raise ValueError(f"--tp and --replicas must be at least 1 (got {t}, {r})")
        note = f"no GPU: {r} replica(s) x TP{t} on the CPU ({t * r} model processes)"
        return Placement(t, tuple(() for _ in range(r)), note)
    use = list(gpus) if gpus else list(visible)
    _check_gpus(use, visible)
    t, r = _sizes(len(use), tp, replicas)
    groups = tuple(tuple(use[i * t : (i + 1) * t]) for i in range(r))
    note = f"{len(use)} GPU(s): {r} replica(s) x TP{t} (" + " | ".join(map(_ids, groups)) + ")"
    spare = use[t * r :]
    if spare:
        note += f"; GPU(s) {_ids(spare)} left unused"
    return Placement(t, groups, note)


def _nvidia_smi() -> str:
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return ""
    try:
        out = subprocess.run(
            [exe, "--query-gpu=index", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired):
        return ""
    return out.stdout if out.returncode == 0 else ""


def visible_gpus(
    env: Mapping[str, str] | None = None, query: Callable[[], str] = _nvidia_smi
) -> list[int]:
    """The host's GPU ids this process may hand out, without importing torch (the CLI stays
    light): CUDA_VISIBLE_DEVICES when set (its ids are the host's, as a child's own
    CUDA_VISIBLE_DEVICES must name them), else every GPU nvidia-smi lists; [] without either."""
    env = os.environ if env is None else env
    given = env.get("CUDA_VISIBLE_DEVICES")
    if given is not None:
        parts = [p.strip() for p in given.split(",") if p.strip()]
        try:
            return [int(p) for p in parts]
        except ValueError as exc:
            raise ValueError(
                f"CUDA_VISIBLE_DEVICES={given!r}: placement needs GPU numbers (not UUIDs or "
                "MIG names); set numbers, or pass --gpus"
            ) from exc
    return [int(line) for line in query().split() if line.strip().isdigit()]
