"""Admission of waiting requests into the running batch (SGLang paper Algorithm 1).

For each candidate in policy order: match its prefix (at most ``len(tokens) - 1`` tokens, and at
most ``prefix_limit``), lock the matched node (its tokens move from evictable to locked, which
is Algorithm 1's ``delta``), and admit it if its whole remaining prompt plus its own expected
decode fits in::

    budget = free + evictable - reserved - committed

where ``reserved`` is the expected future decode of the running batch (remaining
``max_new_tokens`` x ``new_token_ratio``; see :func:`decode_reservation` and
:class:`NewTokenRatio`) and ``committed`` is what earlier admissions this step (and the in-flight
chunked request) claimed. While the batch has other work (something running or already admitted
this step), ``cache.protected_size`` is left out of ``evictable``: freshly inserted context
whose follow-up request is likely milliseconds away is not given to an unrelated request
(a request that matched it has locked it, so it no longer counts as protected). With nothing
else to run, protection never holds a request back: the model is not left idle.

Admission stops at the first candidate that does not fit, so a large request is never starved
by smaller ones behind it in policy order.

Per step at most ``chunk_budget`` prompt tokens are prefilled: the last admitted request may be
*chunked* (fewer tokens this step than it has left), and it continues in later steps through
``chunked_remaining`` (one entry per request mid-prefill, oldest first). The oldest of them, the
*head*, is sure of half the budget (rounded up), so every prefill eventually progresses; the
other half goes to the other requests mid-prefill (fewest tokens left first), then to new
admissions in policy order, the last of which may be chunked too; whatever is left goes back to
the head. So a request that arrives during a long prompt's prefill starts at once and gets at
least half of every step's budget until its prompt is in (issue 26: with only one chunked
request at a time, a prompt longer than the half the head left waited for the head's whole
prefill: 63 steps where its own work was 18). With several long prompts mid-prefill at once a
newcomer waits for the ones that started before it, oldest excepted. All slots of a step are
allocated with one ``cache.alloc`` after selection, so the eviction it triggers can never hit
a prefix selected this step (they are all locked by then).

A candidate whose match continues in the host tier (issue 31) loads that part back at
admission (``cache.load_host``: GPU slots now, a host -> GPU copy in the step) when it fits:
a host hit is never recomputed, and the loaded tokens count neither against the chunk budget
(nothing is computed) nor twice against memory. Load-ahead: the model service runs a step's
loads beside that step's forward pass, so such a request (and any other whose match reads
slots loaded in this step, ``cache.loading``) is admitted *loading*: it holds its lock and
counts against memory and ``max_running`` now, but computes nothing this step
(``AdmittedPrefill.loading``, ``n_tokens`` 0); from the next step on it is a request
mid-prefill like a chunked one, and its first chunk goes out as its ADMIT.

Ownership after :func:`admit_prefills` returns, per admitted request:
- ``match.slots``: cache-owned, protected by the lock the adder took on ``match.node``;
- ``new_slots``: request-owned KV slots for ``tokens[match.length : match.length + n_tokens]``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Generic

from scheduler_service.cache.prefix_cache import MatchResult, PrefixCache, match_limit
from scheduler_service.planner.policy import W
from scheduler_service.planner.retraction import RunningLike

DEFAULT_CLIP_MAX_NEW_TOKENS = 4096


@dataclass(frozen=True, slots=True)
class AdmittedPrefill(Generic[W]):
    """One admitted request: prefill ``tokens[prefix_len:end]`` into ``new_slots`` this step."""

    item: W
    match: MatchResult
    new_slots: list[int]
    n_tokens: int
    loading: bool = False  # its prefix is loaded in this step: its first row goes next step

    @property
    def prefix_len(self) -> int:
        return self.match.length

    @property
    def end(self) -> int:
        """Tokens with KV after this step."""
        return self.match.length + self.n_tokens

    @property
    def chunked(self) -> bool:
        """True when prompt tokens remain for later steps (continue via chunked_remaining)."""
        return self.end < len(self.item.tokens)


@dataclass(slots=True)
class PrefillPlan(Generic[W]):
    """What to prefill this step.

    ``continuation_slots``: slots for the next chunk of the head (the oldest request
    mid-prefill; ``[]`` when there is none, ``None`` when it could not be allocated: memory is
    short, and the caller should retract). ``more_slots``: the next chunk of each other request
    mid-prefill, in ``chunked_remaining``'s order (``[]``: none this step). ``stop_reason`` says
    why admission stopped: ``"drained"`` (no more candidates), ``"max_running"``,
    ``"chunk_budget"``, ``"memory"``, ``"payload"`` (the step carries all the image bytes it
    may), ``"chunked"`` (the last admitted request is chunked) or ``"continuation_blocked"``.
    """

    admitted: list[AdmittedPrefill[W]]
    continuation_slots: list[int] | None
    stop_reason: str
    more_slots: list[list[int]] = field(default_factory=list)

    @property
    def tokens_this_step(self) -> int:
        cont = len(self.continuation_slots) if self.continuation_slots else 0
        more = sum(len(s) for s in self.more_slots)
        return cont + more + sum(a.n_tokens for a in self.admitted)


def decode_reservation(
    running: Iterable[RunningLike], ratio: float, clip: int = DEFAULT_CLIP_MAX_NEW_TOKENS
) -> float:
    """Expected future decode slots of the running batch: sum of remaining x ratio.

    ``max_new_tokens`` is clipped (SGLang: 4096) so one huge limit does not block admission.
    """
    total = 0
    for r in running:
        rem = min(r.max_new_tokens - r.output_len, clip)
        if rem > 0:
            total += rem
    return total * ratio


class NewTokenRatio:
    """Estimated fraction of a request's remaining ``max_new_tokens`` it will still generate.

    Most requests stop (EOS) well before their limit, so reserving the full limit would admit
    too few. Like SGLang the estimate starts conservative (``init`` 0.7), decays linearly to
    ``minimum`` (0.1) over ``decay_steps`` decode steps while nothing goes wrong, and jumps back
    up when a retraction shows it was too optimistic.
    """

    FLOOR = 0.1

    def __init__(self, init: float = 0.7, minimum: float = FLOOR, decay_steps: int = 600) -> None:
        if not 0.0 <= minimum <= init <= 1.0:
            raise ValueError("need 0 <= minimum <= init <= 1")
        self.init = init
        self.minimum = minimum
        self._decay = (init - minimum) / max(decay_steps, 1)
        self.value = init

    def step(self) -> float:
        """Call once per decode step."""
        self.value = max(self.minimum, self.value - self._decay)
        return self.value

    def on_retract(self, observed: float | None = None) -> float:
        """After a retraction: back to at least ``init`` (or the ``observed`` generated fraction
        of the running batch, if higher), never above 1."""
        target = self.init if observed is None else max(self.init, observed)
        self.value = min(1.0, max(self.value, target))
        return self.value


def admit_prefills(
    candidates: Iterable[W],
    cache: PrefixCache,
    *,
    chunk_budget: int,
    max_running: int,
    num_running: int,
    reserved_tokens: float = 0.0,
    new_token_ratio: float = 0.7,
    chunked_remaining: int | Sequence[int] = 0,
    clip_max_new_tokens: int = DEFAULT_CLIP_MAX_NEW_TOKENS,
    payload: Callable[[W, int], int] | None = None,
    payload_budget: int = 0,
) -> PrefillPlan[W]:
    """Select, lock and allocate this step's prefills (see the module docstring).

    ``num_running``: requests already running (those mid-prefill included);
    ``reserved_tokens``: their expected future decode (:func:`decode_reservation`);
    ``chunked_remaining``: prompt tokens each request mid-prefill still has to prefill, the head
    (oldest) first (an int: one such request; 0 or empty: none). They are served ahead of new
    admissions and are not part of ``reserved_tokens``. Each admitted item's ``match`` is
    refreshed (earlier matches may be stale after evictions). ``payload(item, cached)``: bytes
    an admission with ``cached`` positions in the cache carries (images' pixels); after the
    first admission, the step's total stays within ``payload_budget`` (the rest wait a step).
    """
    rem = [chunked_remaining] if isinstance(chunked_remaining, int) else list(chunked_remaining)
    conts = _continuations(rem, chunk_budget, cache)
    if conts is None:
        return PrefillPlan([], None, "continuation_blocked")
    chunk_left = chunk_budget - sum(conts)
    committed = float(sum(rem))  # all of it will need slots in coming steps
    picked: list[tuple[W, MatchResult, int, bool]] = []
    reason = "drained"
    carried = 0
    for w in candidates:
        if num_running + len(picked) >= max_running:
            reason = "max_running"
            break
        if chunk_left <= 0:
            reason = "chunk_budget"
            break
        toks = w.tokens
        if not toks:
            raise ValueError("cannot admit a request with no tokens")
        m = cache.match_prefix(toks, match_limit(len(toks), w.prefix_limit))
        w.match = m
        cache.lock(m.node)
        extend = len(toks) - m.length
        need = extend + min(w.max_new_tokens, clip_max_new_tokens) * new_token_ratio
        usable = cache.evictable_size
        if num_running or picked or committed:  # other work exists: never idle the model
            usable -= cache.protected_size
        budget = cache.free_size + usable - reserved_tokens - committed
        if need > budget:
            cache.unlock(m.node)
            reason = "memory"
            break
        if payload is not None:  # counted before a host load: a load may only shrink it
            size = payload(w, m.length)
            if size and picked and carried + size > payload_budget:
                cache.unlock(m.node)
                reason = "payload"
                break
            carried += size
        loaded = cache.load_host(m) if m.host_len else None  # a host hit: load, not recompute
        if loaded is not None:  # its GPU slots are taken and locked already
            need -= loaded.length - m.length
            m = w.match = loaded
        committed += need
        if loaded is not None or cache.loading(m):  # its prefix is readable next step
            picked.append((w, m, 0, True))
            continue
        extend = len(toks) - m.length
        n = min(extend, chunk_left)
        chunk_left -= n
        picked.append((w, m, n, False))
        if n < extend:
            reason = "chunked"
            break
    if rem and rem[0] > conts[0] and chunk_left > 0:  # the budget the others left
        more = min(rem[0] - conts[0], chunk_left)
        if sum(conts) + more <= cache.free_size + cache.evictable_size:
            conts[0] += more
    return _allocate(cache, conts, picked, reason)


def _continuations(rem: list[int], chunk_budget: int, cache: PrefixCache) -> list[int] | None:
    """Tokens for each request mid-prefill this step (``rem``: what each still has, the head
    first): the head is sure of half the budget (rounded up), the others go fewest-left first
    in what remains. None: the head's chunk cannot get slots (memory is short)."""
    conts = [0] * len(rem)
    chunk_left = chunk_budget
    if rem and rem[0] > 0:
        conts[0] = min(rem[0], chunk_left - chunk_left // 2)
        if conts[0] > cache.free_size + cache.evictable_size:
            return None
        chunk_left -= conts[0]
    for i in sorted(range(1, len(rem)), key=lambda i: rem[i]):
        conts[i] = min(rem[i], chunk_left)
        chunk_left -= conts[i]
    return conts


def _allocate(
    cache: PrefixCache,
    conts: list[int],
    picked: list[tuple[W, MatchResult, int, bool]],
    reason: str,
) -> PrefillPlan[W]:
    """One ``cache.alloc`` for the whole step, split in selection order."""
    total = sum(conts) + sum(p[2] for p in picked)
    slots = cache.alloc(total)
    while slots is None and any(p[2] for p in picked):
        # Budget arithmetic should make this unreachable; stay safe if a caller's numbers lie.
        # A loading admission needs no slots now and keeps its lock: unlocked, its freshly
        # loaded prefix could be evicted and handed to this step's rows while it loads.
        _, m, n, _ = picked.pop(max(i for i, p in enumerate(picked) if p[2]))
        cache.unlock(m.node)
        total -= n
        reason = "memory"
        slots = cache.alloc(total)
    if slots is None and any(conts[1:]):
        # Short of memory for every prefill in progress: the head alone still progresses (the
        # others' chunks wait; retraction frees room if decodes need it).
        conts = [conts[0]] + [0] * (len(conts) - 1)
        slots = cache.alloc(conts[0])
    if slots is None:  # loading admissions need no slots now: they stay admitted (locked)
        held: list[AdmittedPrefill[W]] = [
            AdmittedPrefill(w, m, [], 0, True) for w, m, _, ld in picked if ld
        ]
        return PrefillPlan(held, None, "continuation_blocked")
    pos = 0
    chunks: list[list[int]] = []
    for c in conts:
        chunks.append(slots[pos : pos + c])
        pos += c
    admitted: list[AdmittedPrefill[W]] = []
    for w, m, n, loading in picked:
        admitted.append(AdmittedPrefill(w, m, slots[pos : pos + n], n, loading))
        pos += n
    head = chunks[0] if chunks else []
    return PrefillPlan(admitted, head, reason, chunks[1:])
