"""Host-tier copy counters of the model service (issue 31): per direction (save: GPU -> host,
load: host -> GPU) the copies run, their tokens, their bytes and their time.

The time of a copy is the copy stream's own on CUDA: two timing events recorded on the copy
stream around the copy's work, read only once the second has completed (``Event.query``,
which never waits), so a metric never synchronizes a step; a copy still in flight counts
its copies, tokens and bytes at once and its seconds when a later ``poll`` finds it done. On
CPU the copy is synchronous and its time is the wall time around it. Bytes are this
process's pool's (with tensor parallelism, one rank's share of the KV heads).

One writer: the step thread (``KVPool.copy``); readers (metrics scrape, log lines) read the
totals as they are, a little behind at most.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol

DIRECTIONS = ("save", "load")


class TimingEvent(Protocol):
    """``torch.cuda.Event(enable_timing=True)``."""

    def query(self) -> bool: ...

    def elapsed_time(self, end: Any, /) -> float: ...


@dataclass(slots=True)
class DirectionTotals:
    copies: int = 0
    tokens: int = 0
    bytes: int = 0
    seconds: float = 0.0  # completed copies only (CUDA: a copy in flight adds it later)


@dataclass(slots=True)
class CopyStats:
    save: DirectionTotals = field(default_factory=DirectionTotals)
    load: DirectionTotals = field(default_factory=DirectionTotals)
    # Steps whose forward pass waited for their own loads (a row read a slot they wrote: what
    # a scheduler without load-ahead sends; runner.launch). 0 with this repository's scheduler.
    same_step_waits: int = 0
    # CUDA copies whose time is not read yet: (totals, start event, end event), oldest first.
    _pending: list[tuple[DirectionTotals, TimingEvent, TimingEvent]] = field(default_factory=list)

    def totals(self, to_host: bool) -> DirectionTotals:
        return self.save if to_host else self.load

    def add(
        self,
        to_host: bool,
        tokens: int,
        nbytes: int,
        seconds: float = 0.0,
        events: tuple[TimingEvent, TimingEvent] | None = None,
    ) -> None:
        """One copy: its time is ``seconds``, or (CUDA) the span between ``events``."""
        t = self.totals(to_host)
        t.copies += 1
        t.tokens += tokens
        t.bytes += nbytes
        if events is None:
            t.seconds += seconds
        else:
            self._pending.append((t, *events))
        self.poll()

    def poll(self) -> None:
        """Add the time of every pending copy that has completed (never waits). The copy
        stream runs copies in order, so the first one not done ends the scan."""
        done = 0
        for t, start, end in self._pending:
            if not end.query():
                break
            t.seconds += start.elapsed_time(end) / 1e3
            done += 1
        if done:
            del self._pending[:done]

    @property
    def in_flight(self) -> int:
        return len(self._pending)

    def as_dict(self) -> dict[str, float]:
        """Flat totals, e.g. ``load_bytes`` (log lines)."""
        out: dict[str, float] = {}
        for d in DIRECTIONS:
            t: DirectionTotals = getattr(self, d)
            out[f"{d}_copies"] = t.copies
            out[f"{d}_tokens"] = t.tokens
            out[f"{d}_bytes"] = t.bytes
            out[f"{d}_s"] = round(t.seconds, 6)
        out["same_step_waits"] = self.same_step_waits
        return out
