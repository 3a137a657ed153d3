"""Stop strings over streamed text: detect the first match and hold back any tail that could
still become one, so no part of a stop string is ever streamed to the client."""

from __future__ import annotations

from collections.abc import Sequence


class StopMatcher:
    def __init__(self, stops: Sequence[str]) -> None:
        self.stops = [s for s in stops if s]
        self.longest = max((len(s) for s in self.stops), default=0)

    def find(self, text: str, start: int = 0) -> tuple[int, str] | None:
        """Earliest match at or after `start` (searching a little before it, since a match can
        straddle chunks): (index, stop string)."""
        best: tuple[int, str] | None = None
        lo = max(0, start - self.longest + 1)
        for s in self.stops:
            i = text.find(s, lo)
            if i >= 0 and (best is None or i < best[0]):
                best = (i, s)
        return best

    def safe_length(self, text: str) -> int:
        """Length of the prefix of `text` that can be emitted: text minus the longest suffix
        that is a proper prefix of some stop string."""
        if not self.stops:
            return len(text)
        for k in range(min(self.longest - 1, len(text)), 0, -1):
            tail = text[-k:]
            if any(s.startswith(tail) for s in self.stops):
                return len(text) - k
        return len(text)
