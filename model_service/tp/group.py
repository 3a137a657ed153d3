"""The processes of one tensor-parallel model service: rank 0 (the process the launcher
started, the only one that speaks gRPC) starts ranks 1..N-1 as its children, and the group
lives and dies as one.

- Devices: rank r runs on `--gpus`[r] (indices as CUDA numbers them in this process, i.e.
  within CUDA_VISIBLE_DEVICES), by default GPU r; on CPU every rank runs on the CPU with
  cores / N torch threads each unless `--threads` says otherwise.
- Start: rank 0 picks a free localhost port for torch.distributed's TCP rendezvous and starts
  each child as `python -m model_service <its own flags> --tp-rank r --tp-init tcp://...`;
  the children inherit its environment (NCCL_NVLS_ENABLE=0 is set there first) and its
  stdout/stderr, so their start-up errors land in the model service's log.
- Death: rank 0 watches its children and exits (code 2 if a child's start-up failed, else
  1) the moment one exits; a child watches rank 0's pid and exits when it is gone (and a
  collective with a dead peer fails). So a kill -9 of any rank ends the whole group within a
  fraction of a second, the launcher restarts it, and the scheduler sees one model-service
  loss, which it survives (continuations). Nothing waits on a collective that cannot finish.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading

import structlog
import torch
import torch.distributed as dist

from model_service.tp.comm import NCCL_ENV, TPComm
from model_service.tp.shard import Shard

log = structlog.get_logger(__name__)

POLL_S = 0.1
STARTUP_FAILED = 2  # python -m model_service's exit code for a ModelError


def rank_device(base: torch.device, gpus: list[int], tp: int, rank: int) -> torch.device:
    """Rank `rank`'s device: `gpus[rank]` (default: GPU `rank`) on CUDA, else the CPU."""
    if base.type != "cuda":
        return base
    ids = gpus or list(range(tp))
    if len(ids) != tp:
        raise ValueError(f"--gpus names {len(ids)} GPUs for --tp {tp}: give exactly {tp}")
    count = torch.cuda.device_count()
    bad = [i for i in ids if not 0 <= i < count]
    if bad:
        raise ValueError(
            f"--gpus {','.join(map(str, ids))}: GPU {bad[0]} does not exist here "
            f"({count} visible: 0..{count - 1})"
        )
    return torch.device("cuda", ids[rank])


def _flush_and_exit(code: int) -> None:
    for f in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):
            f.flush()
    os._exit(code)


def start_children(argv: list[str], tp: int, init: str) -> list[subprocess.Popen[bytes]]:
    """Rank 0: start ranks 1..tp-1 with rank 0's flags plus their rank, and watch them."""
    env = {**os.environ, **NCCL_ENV, "RADIXMESH_TP_LEADER_PID": str(os.getpid())}
    env.pop("RADIXMESH_PARENT_PID", None)  # they watch rank 0, not the launcher
    children = []
    for rank in range(1, tp):
        cmd = [sys.executable, "-m", "model_service", *argv]
        cmd += ["--tp-rank", str(rank), "--tp-init", init]
        children.append(subprocess.Popen(cmd, env=env))
    log.info("tp_ranks_started", tp=tp, pids=[c.pid for c in children])
    for rank, child in enumerate(children, start=1):
        threading.Thread(
            target=_watch_child, args=(rank, child), name=f"tp-rank-{rank}", daemon=True
        ).start()
    return children


def _watch_child(rank: int, child: subprocess.Popen[bytes]) -> None:
    code = child.wait()
    log.error("tp_rank_died", rank=rank, pid=child.pid, exit_code=code)
    _flush_and_exit(STARTUP_FAILED if code == STARTUP_FAILED else 1)


def watch_leader() -> None:
    """Ranks 1..N-1: exit as soon as rank 0 (our parent) is gone."""
    leader = int(os.environ.get("RADIXMESH_TP_LEADER_PID", "0")) or os.getppid()
    # Ctrl-C in a terminal reaches the whole process group: rank 0 drains and stops, and
    # the other ranks follow it rather than dying first and cutting its drain short.
    signal.signal(signal.SIGINT, signal.SIG_IGN)

    def watch() -> None:
        while os.getppid() == leader:
            threading.Event().wait(POLL_S)
        log.warning("tp_leader_gone", leader=leader)
        _flush_and_exit(1)

    threading.Thread(target=watch, name="tp-leader-watch", daemon=True).start()


def join_group(
    shard: Shard,
    device: torch.device,
    init: str,
    timeout_s: float,
    cpu_threads: int,
    store: dist.Store | None = None,
) -> TPComm:
    """Every rank: set this process up for its device and join the group (rank 0 through its
    own `store`, the others through `init`, the address of that store)."""
    if device.type == "cpu" and cpu_threads == 0:
        # N ranks on one machine: share the cores instead of each taking all of them.
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // shard.size))
    return TPComm(shard, init, device, timeout_s, store)


def fatal(what: str, exc: BaseException) -> None:
    """A failure that leaves the ranks out of step: end the whole group (see module doc)."""
    log.error("tp_group_failed", what=what, error=repr(exc))
    _flush_and_exit(1)
