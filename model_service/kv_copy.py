"""Host-tier copies at the link's speed (issue 31): the staged path of ``KVPool.copy``.

Layout. The host pool is token-major, ``host[slot] = [2 (K, V), layers, heads, head_dim]``:
one host slot's KV of every layer is one contiguous block, so a run of consecutive host slots
crosses the link as ONE copy whatever the layer count (layer-major, it would be one copy per
layer and per K/V). The GPU pool stays layer-major (attention reads it); the device staging
buffer, token-major like the host, is where the layout turns, with one GPU gather (save) or
scatter (load) per chunk over all its slots.

Plan (``plan``). A copy's (host, GPU) slot pairs are sorted by host slot and cut into chunks
of at most ``chunk_tokens`` (the staging buffers' size, so memory stays bounded whatever the
copy's size). Inside a chunk, each maximal run of consecutive host slots of at least ``min_run``
tokens moves directly between the pinned pool and device staging (one async copy); the other
tokens go through a pinned staging buffer that the CPU fills (load: ``index_select``,
multi-threaded memcpy of whole token rows) or empties (save: ``index_copy_``). Two pinned
buffers alternate so one chunk's CPU work overlaps the previous chunk's transfer.

Ordering (the rule; ``StagedCopier`` keeps it):
- GPU pool and device staging are touched only on the copy stream, which first waits for the
  compute stream (older steps' writes, poisoning); the compute stream then waits for the copy's
  last touch of the GPU pool (``release_main``) before the forward pass reads or reuses slots:
  a save's gather at once; a load's scatter at once, or, with ``load(release=False)``
  (load-ahead), when the caller passes its event on (``KVPool.wait_loads``, next step).
- The host pool is touched by the copy stream (direct runs, async) and by the CPU (gathers and
  scatters). Copy-stream accesses keep queue order by themselves; a CPU access first waits for
  every host access queued before it (``sync()``: the event after the last one; a save's
  scatter waits for its own transfer's event, which is later still), so a load never reads
  bytes a queued save has not written yet, and a save never overwrites bytes a queued load
  has not read yet. Any other reader of the host pool calls ``sync()`` first.
- A pinned staging buffer is touched by the CPU only after the transfer last queued on it.
  (So a save's CPU scatter holds the caller until its transfer lands: the price of host slots
  that are not in runs, rare with the scheduler's allocator; docs/radix.md.)
On CPU the ``Lane`` has no stream and every step is done when it returns, so the same code
runs synchronously and can be compared bit for bit with the reference copy; the unit tests
also inject a lane that defers queued work until something waits for it, which checks each
wait above.
"""

from __future__ import annotations

import array
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from functools import partial
from typing import Protocol, cast

import torch

# Staging size per buffer (one device, two pinned): 128 MiB is ~2.4 ms of a 55 GB/s link, long
# enough that a chunk's fixed cost (a few launches, one scatter) stays a few per cent of it.
CHUNK_BYTES = 128 << 20
# A run at least this big crosses the link directly; a smaller one is gathered by the CPU:
# one copy costs a few microseconds to issue, 1 MiB takes ~20 us at 55 GB/s.
DIRECT_BYTES = 1 << 20


@dataclass(frozen=True, slots=True)
class Chunk:
    """One staging buffer's worth of a copy. Staging row ``r`` holds GPU slot ``gpu[r]``:
    rows of ``runs`` first (each ``(first host slot, tokens, first row)``), then from row
    ``gathered_at`` the host slots ``gather`` in order (moved through pinned staging)."""

    runs: tuple[tuple[int, int, int], ...]
    gather: torch.Tensor
    gathered_at: int
    gpu: torch.Tensor

    @property
    def tokens(self) -> int:
        return int(self.gpu.numel())


def plan(host: list[int], gpu: list[int], chunk_tokens: int, min_run: int) -> list[Chunk]:
    """Chunks of the copy pairing host slot ``host[i]`` with GPU slot ``gpu[i]`` (module
    docstring). A host slot may repeat (a load reads it twice), the pairs stay paired."""
    return list(iter_plan(host, gpu, chunk_tokens, min_run))


def iter_plan(host: list[int], gpu: list[int], chunk_tokens: int, min_run: int) -> Iterator[Chunk]:
    """``plan`` one chunk at a time: the copier queues a chunk's transfers before it plans the
    next, so planning overlaps the link instead of delaying its start."""
    if len(host) != len(gpu) or chunk_tokens < 1 or min_run < 1:
        raise ValueError("plan: host and gpu differ in length, or a size below 1")
    if not host:
        return
    h, order = torch.sort(_ids(host), stable=True)
    g = _ids(gpu)[order]
    for a in range(0, len(host), chunk_tokens):
        yield _chunk(h[a : a + chunk_tokens], g[a : a + chunk_tokens], min_run)


def _ids(ids: list[int]) -> torch.Tensor:
    # Through array: about twice as fast as torch.tensor on a list of Python ints.
    return torch.frombuffer(array.array("q", ids), dtype=torch.int64)


def _chunk(h: torch.Tensor, g: torch.Tensor, min_run: int) -> Chunk:
    starts = torch.ones(h.numel(), dtype=torch.bool)
    torch.ne(h[1:], h[:-1] + 1, out=starts[1:])  # a run ends where the next id is not next
    run = torch.cumsum(starts, 0) - 1  # each token's run
    first = starts.nonzero().flatten()
    lengths = torch.bincount(run)
    long = lengths >= min_run
    in_long = long[run]
    runs = []
    row = 0
    for lo, m in zip(h[first[long]].tolist(), lengths[long].tolist(), strict=True):
        runs.append((lo, m, row))
        row += m
    short = ~in_long
    # Rows: the runs in host order (boolean indexing keeps it), then the gathered tokens.
    return Chunk(tuple(runs), h[short], row, torch.cat((g[in_long], g[short])))


def count_runs(host: list[int]) -> int:
    """Maximal runs of consecutive ids in sorted ``host`` (what the benchmark reports)."""
    s = sorted(host)
    return sum(1 for i, x in enumerate(s) if i == 0 or x != s[i - 1] + 1)


class Event(Protocol):
    """A point in the copy stream's queue (``torch.cuda.Event`` on CUDA)."""

    def synchronize(self) -> None: ...


class Lane:
    """Where GPU-side copy work runs: the copy stream and its events on CUDA; on CPU nothing
    (``run`` does the work at once, so every event is already passed). Tests inject a lane
    that defers queued work until something waits for it, to check the ordering rule."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.stream = torch.cuda.Stream(device) if device.type == "cuda" else None

    def follow_main(self) -> None:
        """Queued work after this starts after the compute stream's work queued so far."""
        if self.stream is not None:
            self.stream.wait_stream(torch.cuda.current_stream(self.device))

    def run(self, fn: Callable[[], object]) -> None:
        """Queue ``fn``'s GPU work (and the copies it issues) on the copy stream."""
        if self.stream is None:
            fn()
            return
        with torch.cuda.stream(self.stream):
            fn()

    def mark(self) -> Event | None:
        """An event after everything queued so far (None: all done already)."""
        if self.stream is None:
            return None
        ev = torch.cuda.Event()
        ev.record(self.stream)
        return ev

    def wait_cpu(self, ev: Event | None) -> None:
        """The CPU waits for ``ev``."""
        if ev is not None:
            ev.synchronize()

    def timer(self) -> torch.cuda.Event | None:
        """A timing event at this point of the copy stream (None on CPU: copies are
        synchronous there and timed by the wall clock)."""
        if self.stream is None:
            return None
        ev = torch.cuda.Event(enable_timing=True)
        ev.record(self.stream)
        return ev

    def release_main(self, ev: Event | None) -> None:
        """The compute stream's later work waits for ``ev`` (the CPU does not)."""
        if ev is not None and self.stream is not None:
            torch.cuda.current_stream(self.device).wait_event(cast(torch.cuda.Event, ev))


def _copy(dst: torch.Tensor, src: torch.Tensor) -> None:
    dst.copy_(src, non_blocking=True)


@dataclass(frozen=True, slots=True)
class CopyShape:
    """What the last copy did (the benchmark reports it)."""

    tokens: int = 0
    chunks: int = 0
    direct_runs: int = 0  # runs that crossed the link as one copy each
    gathered_tokens: int = 0  # tokens moved through pinned staging by the CPU


class StagedCopier:
    """Copies between the layer-major GPU pool ``k``, ``v`` and the token-major ``host`` pool
    through preallocated staging buffers (module docstring: plan and ordering rule)."""

    def __init__(
        self,
        k: torch.Tensor,
        v: torch.Tensor,
        host: torch.Tensor,
        chunk_bytes: int = CHUNK_BYTES,
        direct_bytes: int = DIRECT_BYTES,
        lane: Lane | None = None,
    ) -> None:
        self.k, self.v, self.host = k, v, host
        token_bytes = host[0].numel() * host.element_size()
        most = max(k.shape[1], host.shape[0])  # no copy is longer: its destinations are unique
        self.chunk_tokens = max(1, min(chunk_bytes // token_bytes, most))
        self.min_run = max(1, -(-direct_bytes // token_bytes))
        shape = (self.chunk_tokens, *host.shape[1:])
        self._lane = lane if lane is not None else Lane(k.device)
        pin = k.device.type == "cuda"
        self._dev = torch.empty(shape, dtype=host.dtype, device=k.device)
        self._pin = [torch.empty(shape, dtype=host.dtype, pin_memory=pin) for _ in range(2)]
        self._pin_free: list[Event | None] = [None, None]  # last transfer on each
        self._host_busy: Event | None = None  # after the last queued host access
        self.last = CopyShape()
        # Timing events around the last copy's copy-stream work (CUDA; None on CPU).
        self.last_timing: tuple[torch.cuda.Event, torch.cuda.Event] | None = None

    def sync(self) -> None:
        """Wait until every queued access to the host pool is done (before a CPU access)."""
        self._lane.wait_cpu(self._host_busy)

    def load(self, host: list[int], gpu: list[int], *, release: bool = True) -> Event | None:
        """Host slots ``host[i]`` -> GPU slots ``gpu[i]``. ``release``: the compute stream
        waits for it now; otherwise the caller passes the returned event (after the load's
        last touch of the GPU pool) to ``release_main`` before the compute stream reads or
        writes those slots (load-ahead: the model service does it at the next step)."""
        chunks: list[Chunk] = []
        lane = self._lane
        lane.follow_main()  # older work on these GPU slots (poison, earlier steps) first
        t0 = lane.timer()
        done = None
        for i, c in enumerate(iter_plan(host, gpu, self.chunk_tokens, self.min_run)):
            chunks.append(c)
            st = self._dev[: c.tokens]
            if c.runs:  # one closure per chunk: one stream switch, not one per run
                lane.run(partial(self._runs, c.runs, st, True))
            if c.gather.numel():
                buf = self._pin[i % 2][: c.gather.numel()]
                self.sync()  # queued saves into the host pool have landed
                lane.wait_cpu(self._pin_free[i % 2])  # its previous transfer has read it
                torch.index_select(self.host, 0, c.gather, out=buf)
                lane.run(partial(_copy, st[c.gathered_at :], buf))
                self._pin_free[i % 2] = lane.mark()
            lane.run(partial(self._to_pool, c.gpu, st))
            done = lane.mark()
        self._host_busy = done if done is not None else self._host_busy
        self._record(chunks, t0)
        if release:
            lane.release_main(done)  # the forward pass reads these slots
        return done

    def release_main(self, ev: Event | None) -> None:
        """The compute stream's later work waits for ``ev`` (a deferred load's event)."""
        self._lane.release_main(ev)

    def save(self, gpu: list[int], host: list[int]) -> None:
        """GPU slots ``gpu[i]`` -> host slots ``host[i]`` (unique); the compute stream waits
        only for the GPU gathers (the step may reuse those slots), not for the transfer."""
        chunks: list[Chunk] = []
        lane = self._lane
        lane.follow_main()  # the forward passes that wrote these GPU slots first
        t0 = lane.timer()
        gathered = None
        pending: tuple[torch.Tensor, torch.Tensor, int] | None = None
        for i, c in enumerate(iter_plan(host, gpu, self.chunk_tokens, self.min_run)):
            chunks.append(c)
            st = self._dev[: c.tokens]
            lane.run(partial(self._from_pool, c.gpu, st))
            gathered = lane.mark()
            if c.runs:
                lane.run(partial(self._runs, c.runs, st, False))
            if pending is not None:  # the previous chunk's CPU scatter overlaps this transfer
                self._scatter(*pending)
                pending = None
            if c.gather.numel():
                # No wait: the CPU last touched this buffer in a scatter that has returned.
                buf = self._pin[i % 2][: c.gather.numel()]
                lane.run(partial(_copy, buf, st[c.gathered_at :]))
                self._pin_free[i % 2] = lane.mark()
                pending = (buf, c.gather, i % 2)
        end = lane.mark()
        self._host_busy = end if end is not None else self._host_busy
        if pending is not None:
            self._scatter(*pending)
        self._record(chunks, t0)
        lane.release_main(gathered)

    def _runs(self, runs: tuple[tuple[int, int, int], ...], st: torch.Tensor, load: bool) -> None:
        """Copy stream: each run between the pinned pool and its staging rows, one async copy."""
        for lo, n, row in runs:
            if load:
                st[row : row + n].copy_(self.host[lo : lo + n], non_blocking=True)
            else:
                self.host[lo : lo + n].copy_(st[row : row + n], non_blocking=True)

    def _to_pool(self, gpu: torch.Tensor, st: torch.Tensor) -> None:
        """Copy stream: staging rows (token-major) -> GPU pool slots ``gpu`` (layer-major)."""
        d = gpu.to(self.k.device, non_blocking=True)
        self.k.index_copy_(1, d, st[:, 0].transpose(0, 1))
        self.v.index_copy_(1, d, st[:, 1].transpose(0, 1))

    def _from_pool(self, gpu: torch.Tensor, st: torch.Tensor) -> None:
        """Copy stream: GPU pool slots ``gpu`` -> staging rows."""
        d = gpu.to(self.k.device, non_blocking=True)
        st[:, 0].copy_(self.k.index_select(1, d).transpose(0, 1))
        st[:, 1].copy_(self.v.index_select(1, d).transpose(0, 1))

    def _scatter(self, buf: torch.Tensor, ids: torch.Tensor, b: int) -> None:
        """CPU: pinned staging ``buf`` -> host slots ``ids``, once its transfer has landed (the
        event is after every earlier host access on the stream, so it is also ``sync``)."""
        self._lane.wait_cpu(self._pin_free[b])
        self.host.index_copy_(0, ids, buf)

    def _record(self, chunks: list[Chunk], t0: torch.cuda.Event | None) -> None:
        t1 = self._lane.timer() if t0 is not None else None
        self.last_timing = (t0, t1) if t0 is not None and t1 is not None else None
        self.last = CopyShape(
            tokens=sum(c.tokens for c in chunks),
            chunks=len(chunks),
            direct_runs=sum(len(c.runs) for c in chunks),
            gathered_tokens=sum(int(c.gather.numel()) for c in chunks),
        )
