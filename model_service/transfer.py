"""Host-to-device copies that never stall the host on queued GPU work.

`torch.tensor(values, device="cuda")` copies from pageable memory and then waits for the
stream, i.e. for every kernel already queued: one such copy while step N runs makes launching
step N+1 wait for N. Staging through pinned memory with `non_blocking=True` queues the copy
behind N instead (torch's caching host allocator keeps the pinned block alive until the copy
has run).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch


def to_device(
    values: Sequence[int] | Sequence[float], dtype: torch.dtype, device: torch.device
) -> torch.Tensor:
    if device.type != "cuda":
        return torch.tensor(values, dtype=dtype, device=device)
    return torch.tensor(values, dtype=dtype, pin_memory=True).to(device, non_blocking=True)


def array_to_device(a: np.ndarray, device: torch.device) -> torch.Tensor:
    t = torch.from_numpy(a)
    if device.type != "cuda":
        return t.to(device)
    return t.pin_memory().to(device, non_blocking=True)


def to_host(t: torch.Tensor) -> torch.Tensor:
    """Start copying `t` to host memory; read the result only after the step's done-event."""
    if t.device.type != "cuda":
        return t
    out = torch.empty(t.shape, dtype=t.dtype, pin_memory=True)
    out.copy_(t, non_blocking=True)
    return out
