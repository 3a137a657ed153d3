"""How this front door's recent routing decisions spread: each replica's share and each
routed-on prefix's share (the share rule of `router.py`). Pure bookkeeping, no I/O.

Both are exponentially decayed counts over about `window` decisions: each decision multiplies
every count by 1 - 1/window, then adds 1 to its replica's count and to its prefix's. Replica
counts are decayed in place (a few replicas); prefix counts lazily, through one common scale
factor, since there is one per distinct prefix routed on (renormalized, and the faded ones
dropped, whenever the factor gets small).

A replica's share is judged once the candidates' counts add up to one decision each. A
prefix is hot when its share of the decisions made since it first appeared is above an even
share with ~95 % confidence (the Wilson lower bound of that share, its first decision left
out since that one only made it known): a new system prompt that every request of a burst
shares is hot after a handful of decisions, while one of many prefixes that each carry less
than a replica's worth of traffic almost never looks hot by chance.

Invariant: the replica counts add up to at most `window` (a geometric series); a prefix's
count is at most the sum of the replica counts and equals the sum of its per-replica counts
(`prefix_count_at`, up to faded entries); `_first` has exactly the keys of `_prefix`.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

CONFIDENCE_Z = 1.645  # one-sided ~95 %
MIN_JUDGED = 2  # decisions before any replica share is judged
_FADED = 1e-3  # a count below this is forgotten
_RENORMALIZE_BELOW = 1e-12


class TrafficShare:
    def __init__(self, window: int) -> None:
        self.decay = 1.0 - 1.0 / max(window, 1)
        self.counts: dict[str, float] = {}  # replica address -> decayed count
        self._prefix: dict[int, float] = {}  # prefix key -> decayed count / _scale
        self._at: dict[tuple[int, str], float] = {}  # (prefix, replica) -> the same, per replica
        self._first: dict[int, int] = {}  # prefix key -> the decision that first routed on it
        self._scale = 1.0
        self._decisions = 0

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
        self._decisions += 1
        self._scale *= decay
        if prefix is not None:
            self._prefix[prefix] = self._prefix.get(prefix, 0.0) + 1.0 / self._scale
            at = (prefix, address)
            self._at[at] = self._at.get(at, 0.0) + 1.0 / self._scale
            self._first.setdefault(prefix, self._decisions)
        if self._scale < _RENORMALIZE_BELOW:
            s = self._scale
            self._prefix = {k: v * s for k, v in self._prefix.items() if v * s >= _FADED}
            self._first = {k: v for k, v in self._first.items() if k in self._prefix}
            self._at = {k: v * s for k, v in self._at.items() if v * s >= _FADED}
            self._scale = 1.0

    def prefix_count(self, prefix: int) -> float:
        return self._prefix.get(prefix, 0.0) * self._scale

    def prefix_count_at(self, prefix: int, address: str) -> float:
        """Decisions routed on `prefix` that went to `address` (decayed)."""
        return self._at.get((prefix, address), 0.0) * self._scale

    def over(self, address: str, candidates: Sequence[str], limit: float) -> bool:
        """Whether `address` took more than `limit` times an even share among `candidates`."""
        n = len(candidates)
        if limit <= 0 or n < 2:
            return False
        total = sum(self.counts.get(a, 0.0) for a in candidates)
        judged = total >= self._mass(MIN_JUDGED) - 1e-9
        return judged and self.counts.get(address, 0.0) > limit * total / n

    def _mass(self, k: int) -> float:
        """The decayed weight of the last `k` decisions."""
        d = self.decay
        return (1.0 - d**k) / (1.0 - d) if d < 1.0 else float(k)

    def hot(self, prefix: int, candidates: Sequence[str]) -> bool:
        """Whether requests routed on `prefix` carry more than an even share of the decisions
        made since it appeared (confidently: see the module docstring): more traffic than one
        replica's worth, so it belongs on more than one."""
        n = len(candidates)
        first = self._first.get(prefix)
        if n < 2 or first is None:
            return False
        since = self._decisions - first + 1  # decisions since it first appeared, inclusive
        # Leave out the first decision, which only made the prefix known (~1 of each count).
        own, seen = self.prefix_count(prefix) - 1.0, self._mass(since) - 1.0
        return seen > 0 and wilson_lower(own, seen) > 1.0 / n


def wilson_lower(hits: float, trials: float, z: float = CONFIDENCE_Z) -> float:
    """The Wilson score interval's lower bound for a proportion of `hits` in `trials`."""
    if trials <= 0:
        return 0.0
    p = min(max(hits / trials, 0.0), 1.0)
    z2 = z * z
    centre = p + z2 / (2 * trials)
    half = z * math.sqrt(p * (1 - p) / trials + z2 / (4 * trials * trials))
    return (centre - half) / (1 + z2 / trials)
