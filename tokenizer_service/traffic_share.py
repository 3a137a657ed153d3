"""How this front door's recent routing decisions spread: each replica's share and each
routed-on prefix's share (the share rule of `router.py`). Pure bookkeeping, no I/O.

Both are exponentially decayed counts over about `window` decisions: each decision multiplies
every count by 1 - 1/window, then adds 1 to its replica's count and to its prefix's. Replica
counts are decayed in place (a few replicas); prefix counts lazily, through one common scale
factor, since there is one per distinct prefix routed on (renormalized, and the faded ones
dropped, whenever the factor gets small).

Shares are judged only once the candidates' counts add up to `MIN_PER_REPLICA` decisions each
(or half the window, with many replicas), so a few first decisions never look like skew.

Invariant: the replica counts add up to at most `window` (a geometric series); a prefix's
count is at most the sum of the replica counts.
"""

from __future__ import annotations

from collections.abc import Sequence

MIN_PER_REPLICA = 4
_FADED = 1e-3  # a count below this is forgotten
_RENORMALIZE_BELOW = 1e-12


class TrafficShare:
    def __init__(self, window: int) -> None:
        self.decay = 1.0 - 1.0 / max(window, 1)
        self.counts: dict[str, float] = {}  # replica address -> decayed count
        self._prefix: dict[int, float] = {}  # prefix key -> decayed count / _scale
        self._scale = 1.0

    def record(self, address: str, prefix: int | None = None) -> None:
        """One decision: to `address`, routed on `prefix` (None: on no cached prefix)."""
        decay, counts = self.decay, self.counts
        for a in list(counts):
            c = counts[a] * decay
            if c < _FADED:  # a replica long out of traffic (or gone)
                del counts[a]
            else:
                counts[a] = c
        counts[address] = counts.get(address, 0.0) + 1.0
        self._scale *= decay
        if prefix is not None:
            self._prefix[prefix] = self._prefix.get(prefix, 0.0) + 1.0 / self._scale
        if self._scale < _RENORMALIZE_BELOW:
            s = self._scale
            self._prefix = {k: v * s for k, v in self._prefix.items() if v * s >= _FADED}
            self._scale = 1.0

    def prefix_count(self, prefix: int) -> float:
        return self._prefix.get(prefix, 0.0) * self._scale

    def _judged_total(self, candidates: Sequence[str]) -> float | None:
        """The candidates' decisions, or None while too few to judge a share by."""
        n = len(candidates)
        if n < 2:
            return None
        total = sum(self.counts.get(a, 0.0) for a in candidates)
        if total < min(MIN_PER_REPLICA * n, 0.5 / (1.0 - self.decay)):
            return None
        return total

    def over(self, address: str, candidates: Sequence[str], limit: float) -> bool:
        """Whether `address` took more than `limit` times an even share among `candidates`."""
        total = self._judged_total(candidates) if limit > 0 else None
        return total is not None and self.counts.get(address, 0.0) > limit * total / len(candidates)

    def hot(self, prefix: int, candidates: Sequence[str]) -> bool:
        """Whether requests routed on `prefix` alone carried more than an even share of the
        decisions: more traffic than one replica's worth, so it belongs on more than one."""
        total = self._judged_total(candidates)
        return total is not None and self.prefix_count(prefix) > total / len(candidates)
