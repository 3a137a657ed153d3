"""The KV pool: one K and one V tensor for all layers, indexed by token slot (page size 1).

The scheduler owns the index space (which slot holds which token); this pool only stores.
Shapes: k, v = [num_layers, capacity, num_kv_heads, head_dim].

Host tier (issue 31, ``--host-kv-tokens``): one token-major tensor
``host = [host_capacity, 2 (K, V), num_layers, num_kv_heads, head_dim]`` in host memory, with its
own slot ids (the scheduler owns those too); ``host_k`` and ``host_v`` are layer-major views of
it. Token-major makes a run of consecutive host slots one contiguous block, so it crosses the
PCIe link as one copy (``kv_copy``). ``copy`` runs one ``KVCopy`` (every layer's K and V of the
named slots):
- on CPU, a plain synchronous indexed copy (whole host rows on a load, the layer-major views
  on a save): the tested reference;
- on CUDA, ``kv_copy.StagedCopier``: chunked, run-aware copies through preallocated staging,
  on a side stream; the compute stream waits for the copy's last touch of the GPU pool before
  the step's forward pass. Its module docstring states the ordering rule for the host bytes:
  anything else that reads the host pool calls ``sync_host()`` first.

Load-ahead (``copy(..., ahead=True)``, what the runner does for a step's copies): the compute
stream does not wait for the load now; ``wait_loads()``, which the runner calls first thing in
the next step, makes it wait for every load issued since the last call. So a load overlaps the
forward pass of the step that carries it, whose rows do not touch the loaded slots (the
scheduler admits the loading request a step later); a step whose rows do (a scheduler without
load-ahead sends one) copies with ``ahead=False`` and waits, as before
(``step_validation.rows_touching_loads``, in the runner). On CPU every copy is done when
``copy`` returns, so nothing is ever pending.

``copy_stats`` (``copy_stats.CopyStats``) counts every copy per direction: copies, tokens,
bytes and time (the copy stream's own on CUDA, read lazily; wall time on CPU).
"""

from __future__ import annotations

import time

import torch

from model_service.copy_stats import CopyStats
from model_service.kv_copy import CHUNK_BYTES, DIRECT_BYTES, Event, StagedCopier


def _layer_major(host: torch.Tensor, kv: int) -> torch.Tensor:
    """The token-major host pool's K (``kv`` 0) or V (1) as a layer-major view, the GPU pool's
    layout: [layers, host slots, heads, head_dim]."""
    return host[:, kv].transpose(0, 1)


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
        self.host: torch.Tensor | None = None
        self.copier: StagedCopier | None = None
        self.copy_stats = CopyStats()
        self._token_bytes = kv_bytes_per_token(num_layers, num_kv_heads, head_dim, dtype)
        self._loads_pending: list[Event] = []  # load-ahead: the compute stream has not waited

    def add_host_tier(
        self,
        capacity: int,
        *,
        staged: bool | None = None,
        chunk_bytes: int = CHUNK_BYTES,
        direct_bytes: int = DIRECT_BYTES,
    ) -> None:
        """Allocate the host pool: ``capacity`` token slots of every layer's K and V, pinned
        on CUDA, once, at start. Pinning N GiB costs start-up time in proportion to N (the
        driver faults in and locks every page) and N GiB the OS can no longer swap; torch's
        pinned allocator also rounds the request up to a power of two, so a pool of 80 GiB
        pins 128 GiB (size ``--host-kv-tokens`` just under a power of two of bytes). The
        staged copy path (the default on CUDA; ``staged=True`` runs it on CPU for tests) adds
        one device and two pinned staging buffers of ``chunk_bytes`` each."""
        if capacity < 1:
            raise ValueError("host KV capacity must be at least one token")
        cuda = self.k.device.type == "cuda"
        shape = (capacity, 2, self.k.shape[0], *self.k.shape[2:])
        self.host = torch.zeros(shape, dtype=self.k.dtype, pin_memory=cuda)
        self.host_capacity = capacity
        if cuda if staged is None else staged:
            self.copier = StagedCopier(self.k, self.v, self.host, chunk_bytes, direct_bytes)

    @property
    def host_k(self) -> torch.Tensor | None:
        """Layer-major view [layers, host slots, heads, head_dim] of the host K."""
        return None if self.host is None else _layer_major(self.host, 0)

    @property
    def host_v(self) -> torch.Tensor | None:
        return None if self.host is None else _layer_major(self.host, 1)

    def copy(self, to_host: bool, src: list[int], dst: list[int], *, ahead: bool = False) -> None:
        """Copy slots ``src`` of one pool into slots ``dst`` of the other (see the module
        docstring); the step's forward pass, queued after this, sees the result, except that
        with ``ahead`` a load is seen only after the next ``wait_loads()``."""
        if self.host is None:
            raise ValueError("no host KV pool (--host-kv-tokens 0)")
        t0 = time.perf_counter()
        copier = self.copier
        if copier is not None:
            if to_host:
                copier.save(src, dst)
            else:
                ev = copier.load(src, dst, release=not ahead)
                if ahead and ev is not None:
                    self._loads_pending.append(ev)
        else:
            self._reference_copy(to_host, src, dst)
        timing = copier.last_timing if copier is not None else None
        self.copy_stats.add(
            to_host, len(src), len(src) * self._token_bytes, time.perf_counter() - t0, timing
        )

    def wait_loads(self) -> None:
        """The compute stream's later work waits for every load issued ``ahead`` since the
        last call (the runner calls it before anything else of a step)."""
        pending = self._loads_pending
        if not pending:
            return
        assert self.copier is not None
        for ev in pending:
            self.copier.release_main(ev)
        self._loads_pending = []

    @property
    def loads_pending(self) -> int:
        """Loads issued ahead that the compute stream does not wait for yet."""
        return len(self._loads_pending)

    def _reference_copy(self, to_host: bool, src: list[int], dst: list[int]) -> None:
        host = self.host
        assert host is not None
        # The reference: plain indexed copies, synchronous. A save writes through the
        # layer-major views (one index_copy_ per pool, like the GPU side), a load gathers
        # whole host rows (one token's K and V of every layer: the fastest CPU gather).
        dev = self.k.device
        if to_host:
            s = torch.tensor(src, dtype=torch.int64, device=dev)
            d = torch.tensor(dst, dtype=torch.int64)
            _layer_major(host, 0).index_copy_(1, d, self.k.index_select(1, s).cpu())
            _layer_major(host, 1).index_copy_(1, d, self.v.index_select(1, s).cpu())
            return
        rows = host.index_select(0, torch.tensor(src, dtype=torch.int64)).to(dev)
        d = torch.tensor(dst, dtype=torch.int64, device=dev)
        self.k.index_copy_(1, d, rows[:, 0].transpose(0, 1))
        self.v.index_copy_(1, d, rows[:, 1].transpose(0, 1))

    def sync_host(self) -> None:
        """Wait until queued copies have finished with the host pool (before reading it)."""
        if self.copier is not None:
            self.copier.sync()

    def write(self, layer: int, slots: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
        self.k[layer].index_copy_(0, slots, k.to(self.k.dtype))
        self.v[layer].index_copy_(0, slots, v.to(self.v.dtype))

    def poison(self, slots: torch.Tensor) -> None:
        """Debug: a freed slot reads as NaN, so any read after free shows up in the output."""
        if self.nan_fill and slots.numel():
            self.k[:, slots] = float("nan")
            self.v[:, slots] = float("nan")
