"""Host-to-device copies that never stall the host on queued GPU work.

`torch.tensor(values, device="cuda")` copies from pageable memory and then waits for the
stream, i.e. for every kernel already queued: one such copy while step N runs makes launching
step N+1 wait for N. Staging through pinned memory with `non_blocking=True` queues the copy
behind N instead (torch's caching host allocator keeps the pinned block alive until the copy
has run).

A step's dozen small inputs go through `HostStager` instead: one reused pinned buffer and one
copy per batch, with no pinned allocation per tensor.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch


def to_device(
    values: Sequence[int] | Sequence[float], dtype: torch.dtype, device: torch.device
) -> torch.Tensor:
    if device.type != "cuda":
        return torch.tensor(values, dtype=dtype, device=device)
    return torch.tensor(values, dtype=dtype, pin_memory=True).to(device, non_blocking=True)


def to_host(t: torch.Tensor) -> torch.Tensor:
    """Start copying `t` to host memory; read the result only after the step's done-event."""
    if t.device.type != "cuda":
        return t
    out = torch.empty(t.shape, dtype=t.dtype, pin_memory=True)
    out.copy_(t, non_blocking=True)
    return out


# -- per-step inputs through reused pinned buffers ------------------------------------------------

_ALIGN = 16  # bytes: every staged tensor starts aligned for any element type it may hold
_NP = {torch.int64: np.int64, torch.int32: np.int32, torch.float32: np.float32}


class Concat:
    """A staged item made of several host arrays, written back to back (one tensor)."""

    __slots__ = ("parts",)

    def __init__(self, parts: Sequence[np.ndarray]) -> None:
        self.parts = parts

    def __len__(self) -> int:
        return sum(len(p) for p in self.parts)


Values = Sequence[int] | Sequence[float] | np.ndarray | Concat
Staged = tuple[Values, torch.dtype]


class _Slot:
    """One pinned host buffer and its device twin; `copied` follows the copy that last read
    the host buffer."""

    def __init__(self, nbytes: int, device: torch.device) -> None:
        pin = device.type == "cuda"
        self.host = torch.empty(nbytes, dtype=torch.uint8, pin_memory=pin)
        self.host_np = self.host.numpy()
        self.dev = torch.empty(nbytes, dtype=torch.uint8, device=device)
        self.copied: Any = None  # a torch.cuda.Event (or a test's stand-in)


class HostStager:
    """A step's small host inputs (token ids, positions, KV slot lists, sampling parameters)
    reach the device in ONE copy per batch, through pinned buffers reused round-robin.

    `pin_memory()` per tensor costs a pinned allocation, a host copy on torch's intra-op pool
    and an event per call: the GPU profile of the fourth session found it the model service's
    top frame (17-21 % of its samples) with a dozen such tensors per step. Here the values
    are written straight into a pinned buffer by numpy and sent with one async copy.

    Reuse rule (the one `PlanGuard` keeps for flashinfer's buffers): a slot's host buffer is
    rewritten only after the event recorded just after its last copy has passed; with
    `depth` slots and two steps in flight that wait is normally long over. Its device buffer
    is rewritten by a later copy on the same stream, so after every kernel that read it. The
    returned tensors are views of the slot's device buffer: read them only in this step.
    On CPU no staging is needed and each item becomes its own tensor (`stage_on_cpu` runs
    the staged path there too, with `new_event` standing in for CUDA events: tests)."""

    def __init__(
        self,
        device: torch.device,
        depth: int = 8,
        initial_bytes: int = 64 << 10,
        *,
        stage_on_cpu: bool = False,
        new_event: Callable[[], Any] | None = None,
    ) -> None:
        self.device = device
        self.staged = device.type == "cuda" or stage_on_cpu
        self._new_event = new_event if new_event is not None else torch.cuda.Event
        self._slots: list[_Slot] = []
        self._depth = depth
        self._initial = initial_bytes
        self._next = 0
        self.sends = 0  # batches sent (tests)
        self.waits = 0  # sends that found their slot's last copy not yet run

    def send(self, items: Sequence[Staged]) -> list[torch.Tensor]:
        self.sends += 1
        if not self.staged:
            return [_cpu_tensor(v, dt) for v, dt in items]
        offsets, end = layout(items)
        slot = self._slot(end)
        pack(slot.host_np, items, offsets)
        slot.dev[:end].copy_(slot.host[:end], non_blocking=True)
        slot.copied = self._new_event()
        slot.copied.record()
        return [
            slot.dev[off : off + len(v) * dt.itemsize].view(dt)
            for (v, dt), off in zip(items, offsets, strict=True)
        ]

    def _slot(self, nbytes: int) -> _Slot:
        i = self._next
        self._next = (i + 1) % self._depth
        if i == len(self._slots):
            self._slots.append(_Slot(max(nbytes, self._initial), self.device))
            return self._slots[i]
        slot = self._slots[i]
        if slot.copied is not None and not slot.copied.query():
            self.waits += 1
            slot.copied.synchronize()
        if slot.host.numel() < nbytes:  # grown by doubling; the old pair is done with
            slot = self._slots[i] = _Slot(max(nbytes, 2 * slot.host.numel()), self.device)
        return slot


def layout(items: Sequence[Staged]) -> tuple[list[int], int]:
    """Byte offset of every item in a staging buffer, and the bytes used (at least one unit:
    a batch of empty items still has a place)."""
    offsets: list[int] = []
    end = 0
    for v, dt in items:
        offsets.append(end)
        end += -(-len(v) * dt.itemsize // _ALIGN) * _ALIGN
    return offsets, max(end, _ALIGN)


def pack(buf: np.ndarray, items: Sequence[Staged], offsets: Sequence[int]) -> None:
    """Write every item's values into the uint8 buffer `buf` at its offset, as its dtype."""
    for (v, dt), off in zip(items, offsets, strict=True):
        _write(buf, off, v, dt)


def _write(buf: np.ndarray, off: int, v: Values, dt: torch.dtype) -> None:
    npdt = _NP[dt]
    n = len(v)
    if n == 0:
        return
    dst = buf[off : off + n * dt.itemsize].view(npdt)
    if isinstance(v, Concat):
        at = 0
        for p in v.parts:
            dst[at : at + len(p)] = p
            at += len(p)
    else:
        dst[:] = v


def _cpu_tensor(v: Values, dt: torch.dtype) -> torch.Tensor:
    if isinstance(v, Concat):
        if not v.parts:
            return torch.empty(0, dtype=dt)
        return torch.from_numpy(np.concatenate(v.parts).astype(_NP[dt], copy=False))
    if isinstance(v, np.ndarray):
        return torch.from_numpy(v.astype(_NP[dt], copy=False))
    return torch.tensor(v, dtype=dt)
