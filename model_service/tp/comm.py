"""The tensor-parallel group: torch.distributed collectives for the model, and the control
channel that carries every step from rank 0 to the other ranks.

One code path for both transports: NCCL between GPUs, gloo between CPU processes (so CI runs
tensor parallelism on CPU). The control channel is always a gloo group (host bytes: the
scheduler's protobuf Step and StepMasks messages as rank 0 received them, re-serialised), so
a rank waiting for the next step blocks on a socket, not on a GPU kernel.

`NCCL_NVLS_ENABLE=0` (and the PyTorch / NVSHMEM switches of NVLink multicast, `NCCL_ENV`) is
set before NCCL starts: the multi-GPU machines require NVLink multicast off.
"""

from __future__ import annotations

import os
from datetime import timedelta

import torch
import torch.distributed as dist

from model_service.tp.shard import Shard

# NVLink multicast off in NCCL, PyTorch's symmetric memory and NVSHMEM (the multi-GPU machines
# require it; NVLS reductions buy nothing at these message sizes).
NCCL_ENV = {
    "NCCL_NVLS_ENABLE": "0",
    "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
    "NVSHMEM_DISABLE_NVLS": "1",
}
CTRL_TIMEOUT = timedelta(days=365)

# Control messages: one tag byte, then the payload.
STEP, MASKS, MASKS_FAILED, RESET = b"S", b"M", b"E", b"R"


def open_store(size: int, timeout_s: float) -> dist.TCPStore:
    """Rank 0's rendezvous store, on a port the kernel picks as it binds: a port chosen first
    and bound later can be taken in between (by a service of another stack on this host)."""
    # Not waiting for the workers here: the other ranks are started after it listens.
    return dist.TCPStore(
        "127.0.0.1",
        0,
        size,
        is_master=True,
        timeout=timedelta(seconds=timeout_s),
        wait_for_workers=False,
    )


def _connect_store(init_method: str, timeout_s: float) -> dist.TCPStore:
    """Ranks 1..N-1: a client of rank 0's store at tcp://host:port."""
    host, _, port = init_method.removeprefix("tcp://").rpartition(":")
    return dist.TCPStore(host, int(port), is_master=False, timeout=timedelta(seconds=timeout_s))


class TPComm:
    """Collectives over the group `shard` belongs to (rank 0 .. size-1, one per process)."""

    def __init__(
        self,
        shard: Shard,
        init_method: str,
        device: torch.device,
        timeout_s: float,
        store: dist.Store | None = None,
    ):
        """`store`: rank 0's rendezvous store, already listening (open_store); the other
        ranks connect to it at `init_method` (tcp://host:port). Every rank hands
        init_process_group a store of its own making, so all see the same keys (given an
        init_method instead, torch prefixes them)."""
        self.shard = shard
        self.device = device
        if device.type == "cuda":
            os.environ.update(NCCL_ENV)  # forced, not defaulted: the machines require it
            torch.cuda.set_device(device)
        # Every rank of a group is on this host (a pod): gloo talks over the loopback device.
        os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
        backend = "nccl" if device.type == "cuda" else "gloo"
        dist.init_process_group(
            backend,
            store=store if store is not None else _connect_store(init_method, timeout_s),
            rank=shard.rank,
            world_size=shard.size,
            timeout=timedelta(seconds=timeout_s),
            device_id=device if device.type == "cuda" else None,
        )
        self.group = dist.group.WORLD
        # Host-side control traffic has a group of its own, on gloo whatever the model uses:
        # a rank waits there for the next step as long as the service idles (a loss is seen
        # by the process watchers of tp.group, not by a timeout).
        self.ctrl = dist.new_group(backend="gloo", timeout=CTRL_TIMEOUT)
        self._len = torch.zeros(1, dtype=torch.int64)

    @property
    def rank(self) -> int:
        return self.shard.rank

    # -- model collectives (inside the forward pass; captured by CUDA graphs on GPU) ---------
    def all_reduce(self, x: torch.Tensor) -> torch.Tensor:
        """Sum of every rank's `x`, in place (row-parallel layers, the embedding)."""
        dist.all_reduce(x, group=self.group)
        return x

    def all_gather_last(self, x: torch.Tensor) -> torch.Tensor:
        """[R, n] on every rank -> [R, size * n], rank order along the last dim (the logits)."""
        parts = [torch.empty_like(x) for _ in range(self.shard.size)]
        dist.all_gather(parts, x.contiguous(), group=self.group)
        return torch.cat(parts, dim=-1)

    def agree_min(self, value: int) -> int:
        """The smallest of every rank's `value` (start-up: the KV pool size all ranks hold)."""
        t = torch.tensor([value], dtype=torch.int64)
        dist.all_reduce(t, op=dist.ReduceOp.MIN, group=self.ctrl)
        return int(t[0])

    # -- control channel (host bytes, rank 0 -> all) -----------------------------------------
    def send(self, tag: bytes, payload: bytes = b"") -> None:
        """Rank 0 only: every other rank's `recv` returns (tag, payload)."""
        data = torch.frombuffer(bytearray(tag + payload), dtype=torch.uint8)
        self._len[0] = data.numel()
        dist.broadcast(self._len, 0, group=self.ctrl)
        dist.broadcast(data, 0, group=self.ctrl)

    def recv(self) -> tuple[bytes, bytes]:
        dist.broadcast(self._len, 0, group=self.ctrl)
        data = torch.empty(int(self._len[0]), dtype=torch.uint8)
        dist.broadcast(data, 0, group=self.ctrl)
        raw = data.numpy().tobytes()
        return raw[:1], raw[1:]

    def close(self) -> None:
        if dist.is_initialized():
            dist.destroy_process_group()
