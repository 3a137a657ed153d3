"""The KV pool: one K and one V tensor for all layers, indexed by token slot (page size 1).

The scheduler owns the index space (which slot holds which token); this pool only stores.
Shapes: k, v = [num_layers, capacity, num_kv_heads, head_dim].

Host tier (issue 31, ``--host-kv-tokens``): a second pair ``host_k``, ``host_v`` of the same
layout in host memory (pinned on CUDA), with its own slot ids (the scheduler owns those too).
``copy`` runs one ``KVCopy`` (every layer's K and V of the named slots): on CPU a plain indexed
copy, the tested reference; on CUDA a save gathers on the GPU and copies to the host
synchronously (the slots are reused by this step), and a load gathers on the host into pinned
staging memory, copies it on a side stream with ``non_blocking`` and scatters it there, and the
compute stream waits on that stream's event before the step's forward pass.
"""

from __future__ import annotations

import torch


def kv_bytes_per_token(
    num_layers: int, num_kv_heads: int, head_dim: int, dtype: torch.dtype
) -> int:
    return 2 * num_layers * num_kv_heads * head_dim * torch.tensor([], dtype=dtype).element_size()


class KVPool:
    def __init__(
        self,
        num_layers: int,
        capacity: int,
        num_kv_heads: int,
        head_dim: int,
        dtype: torch.dtype,
        device: torch.device | str,
        nan_fill: bool = False,
    ) -> None:
        if capacity < 1:
            raise ValueError("KV capacity must be at least one token")
        self.capacity = capacity
        self.nan_fill = nan_fill
        shape = (num_layers, capacity, num_kv_heads, head_dim)
        fill = float("nan") if nan_fill else 0.0
        self.k = torch.full(shape, fill, dtype=dtype, device=device)
        self.v = torch.full(shape, fill, dtype=dtype, device=device)
        self.host_capacity = 0
        self.host_k: torch.Tensor | None = None
        self.host_v: torch.Tensor | None = None
        self._copy_stream: torch.cuda.Stream | None = None

    def add_host_tier(self, capacity: int) -> None:
        """Allocate the host pool: ``capacity`` token slots of every layer's K and V."""
        if capacity < 1:
            raise ValueError("host KV capacity must be at least one token")
        cuda = self.k.device.type == "cuda"
        shape = (self.k.shape[0], capacity, *self.k.shape[2:])
        self.host_k = torch.zeros(shape, dtype=self.k.dtype, pin_memory=cuda)
        self.host_v = torch.zeros(shape, dtype=self.k.dtype, pin_memory=cuda)
        self.host_capacity = capacity
        if cuda:
            self._copy_stream = torch.cuda.Stream(self.k.device)

    def copy(self, to_host: bool, src: list[int], dst: list[int]) -> None:
        """Copy slots ``src`` of one pool into slots ``dst`` of the other (see the module
        docstring); the step's forward pass, queued after this, sees the result."""
        hk, hv = self.host_k, self.host_v
        if hk is None or hv is None:
            raise ValueError("no host KV pool (--host-kv-tokens 0)")
        dev = self.k.device
        if to_host:
            s = torch.tensor(src, dtype=torch.int64, device=dev)
            d = torch.tensor(dst, dtype=torch.int64)
            # .cpu() waits for the gather: the host scatter needs the data now.
            hk.index_copy_(1, d, self.k.index_select(1, s).cpu())
            hv.index_copy_(1, d, self.v.index_select(1, s).cpu())
            return
        s = torch.tensor(src, dtype=torch.int64)
        stream = self._copy_stream
        if stream is None:  # CPU: the reference path
            d = torch.tensor(dst, dtype=torch.int64, device=dev)
            self.k.index_copy_(1, d, hk.index_select(1, s))
            self.v.index_copy_(1, d, hv.index_select(1, s))
            return
        sk = hk.index_select(1, s).pin_memory()
        sv = hv.index_select(1, s).pin_memory()
        main = torch.cuda.current_stream(dev)
        stream.wait_stream(main)  # earlier work on these slots (poison, older steps) first
        with torch.cuda.stream(stream):
            d = torch.tensor(dst, dtype=torch.int64).to(dev, non_blocking=True)
            self.k.index_copy_(1, d, sk.to(dev, non_blocking=True))
            self.v.index_copy_(1, d, sv.to(dev, non_blocking=True))
            done = torch.cuda.Event()
            done.record(stream)
        main.wait_event(done)  # the forward pass reads these slots

    def write(self, layer: int, slots: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
        self.k[layer].index_copy_(0, slots, k.to(self.k.dtype))
        self.v[layer].index_copy_(0, slots, v.to(self.v.dtype))

    def poison(self, slots: torch.Tensor) -> None:
        """Debug: a freed slot reads as NaN, so any read after free shows up in the output."""
        if self.nan_fill and slots.numel():
            self.k[:, slots] = float("nan")
            self.v[:, slots] = float("nan")
