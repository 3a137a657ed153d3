"""Per-request state inside the scheduler (no protobuf: the frontend link converts)."""

from __future__ import annotations

import enum
import itertools
import time
from collections.abc import Iterable
from dataclasses import dataclass, field

from radixmesh_wire.images import ImageInput
from radixmesh_wire.step_ops import Sampling
from scheduler_service.cache.prefix_cache import MatchResult, PrefixCache
from scheduler_service.sessions.outbox import Outbox

_arrivals = itertools.count()


class Phase(enum.Enum):
    WAITING = "waiting"
    # Admitted (handle, locked prefix) but not yet sent: its prefix is being loaded from the
    # host tier in the step that admitted it, so it joins a batch from the next step on.
    LOADING = "loading"
    PREFILL = "prefill"  # admitted, prompt partly in KV (chunked)
    DECODE = "decode"
    DONE = "done"


# A request's sampling and length: the one sampling type of the wire package (its defaults
# are the one table, `radixmesh_wire.step_ops.DEFAULTS`).
SamplingSpec = Sampling


@dataclass(eq=False)  # identity semantics: requests are compared by object
class Request:
    """Invariants: `kv_slots` holds the KV slots of `fill[:kv_len]` in order; the first
    `cached_len` of them belong to the prefix cache (locked through `node`), the rest are owned
    by this request until it finishes (then the cache takes them) or aborts (then freed).

    One writer: `handle`, `phase`, `kv_slots`, `kv_len`, `cached_len`, `node`, `pending`,
    `epoch`, `jump` and `no_jump_at` change only through the transitions at the end of this
    class (admit, extend, decode, truncate, release, requeue, ...), each of which keeps the
    invariant; tests/unit/test_request_owner.py checks that no other module assigns them."""

    rid: str
    session: str
    prompt: list[int]
    spec: SamplingSpec
    eos_ids: frozenset[int]
    output: list[int] = field(default_factory=list)
    output_logprobs: list[tuple[float, list[int], list[float]]] = field(default_factory=list)
    arrival: int = field(default_factory=lambda: next(_arrivals))
    submitted_at: float = field(default_factory=time.perf_counter)  # queue-time metric
    phase: Phase = Phase.WAITING
    handle: int = -1
    kv_slots: list[int] = field(default_factory=list)
    cached_len: int = 0
    node: object | None = None
    fill: list[int] = field(default_factory=list)  # tokens to prefill: prompt + output so far
    kv_len: int = 0
    first_cached: int = -1  # cached tokens at first admission (reported to the client)
    resumed_output: int = 0  # output tokens that arrived with a resubmission
    aborted: bool = False
    match: MatchResult | None = None  # filled by the policy while waiting
    grammar: tuple[str, str] | None = None  # (json_schema|regex|ebnf, text)
    jump: tuple[int, list[int]] | None = None  # pending jump-forward: (rollback, new tokens)
    no_jump_at: int = -1  # output length at which a jump could not be applied
    # Overlap: tokens sampled by sent steps whose results are not applied yet (0 or 1). A
    # decode built meanwhile reads its input token on the worker, so `kv_len` may be
    # len(fill) + 1 until the result comes. `epoch` counts releases: a step's result only
    # applies to the incarnation (handle, epoch) it was built for.
    pending: int = 0
    epoch: int = 0
    key: int = 0  # the session's id for it on the wire (SubmitRequest.key)
    # Prefix-cache namespace (tenant isolation): 0 is the default namespace; otherwise every
    # cache key is the token id plus this offset (>= 2^32, above every token id), so keys of
    # different namespaces never match and no KV is shared across them.
    cache_ns: int = 0
    # Its images (multimodal models): the prompt holds each one's pseudo id at its positions
    # (so the radix tree keys images by content); every ADMIT carries them to the model.
    images: tuple[ImageInput, ...] = ()
    # Where its output goes: the session's shared outbox once submitted (Scheduler.submit).
    outbox: Outbox = field(default_factory=lambda: Outbox(""))

    def __post_init__(self) -> None:
        self.fill = self.prompt + self.output
        # Token ids that end it (the model's EOS unless ignore_eos, and the stop ids): checked
        # for every sampled token, so computed once.
        spec = self.spec
        eos = frozenset() if spec.ignore_eos else self.eos_ids
        self.stop_ids: frozenset[int] = eos | frozenset(spec.stop_token_ids)
        self.wants_logprobs = bool(spec.return_logprob or spec.top_logprobs)
        self._keys: list[int] = []
        self._keys_of: list[int] | None = None

    def end_with_grammar(self, model_eos: Iterable[int]) -> None:
        """A constrained request ends where its grammar ends: the model's EOS (which the grammar
        allows only where its language may end) stops it even with ignore_eos, and the model
        side lets it through min_new_tokens when nothing else is allowed (docs/constrained.md).
        Otherwise a grammar that accepts only EOS would leave nothing valid to sample."""
        if self.grammar is not None:
            self.stop_ids = self.stop_ids | frozenset(model_eos)

    @property
    def tokens(self) -> list[int]:
        """`fill` as prefix-cache keys (the tokens themselves in the default namespace)."""
        if not self.cache_ns:
            return self.fill
        return self.cache_keys(len(self.fill))

    def cache_keys(self, n: int) -> list[int]:
        """The prefix-cache keys of `fill[:n]`; namespaced keys are built once and extended as
        `fill` grows (a jump-forward replaces `fill`, which rebuilds them)."""
        fill = self.fill
        if not self.cache_ns:
            return fill[:n]
        keys = self._keys
        if self._keys_of is not fill or len(keys) > len(fill):
            keys = self._keys = []
            self._keys_of = fill
        if len(keys) < len(fill):
            off = self.cache_ns
            keys.extend(t + off for t in fill[len(keys) :])
        return keys[:n] if n < len(keys) else keys

    @property
    def max_new_tokens(self) -> int:
        return self.spec.max_new_tokens

    @property
    def prefix_limit(self) -> int:
        """Most prefix tokens the cache may serve: one token is always computed (its logits are
        sampled), and prompt-token logprobs need logits from `from - 1` on."""
        limit = len(self.fill) - 1
        p = self.spec.prompt_logprobs_from
        if p >= 0:
            limit = min(limit, max(p - 1, 0))
        return max(limit, 0)

    @property
    def output_len(self) -> int:
        return len(self.output)

    @property
    def prompt_len(self) -> int:
        return len(self.prompt)

    @property
    def known_kv(self) -> int:
        """Tokens of `fill` whose KV slots are assigned (excludes a pending token's decode)."""
        return min(self.kv_len, len(self.fill))

    @property
    def owned(self) -> int:
        return len(self.kv_slots) - self.cached_len

    @property
    def remaining(self) -> int:
        return max(self.spec.max_new_tokens - len(self.output), 0)

    def jumped_output(self, rollback: int, tokens: list[int]) -> list[int]:
        """The output after a jump-forward: its last `rollback` tokens replaced by `tokens`
        (the grammar's forced text, retokenized across the boundary), within the budget."""
        return (self.output[: len(self.output) - rollback] + tokens)[: self.spec.max_new_tokens]

    def take_jump(self, rollback: int, new_out: list[int]) -> int:
        """Make `new_out` (from `jumped_output`) the output and stream the edit: the rollback,
        then the new tokens. Returns how many output tokens were kept."""
        kept = len(self.output) - rollback
        self.outbox.rollback(self.key, rollback)
        self.outbox.tokens(self.key, new_out[kept:])
        self.output = new_out
        self.fill = self.prompt + new_out
        return kept

    # -- KV transitions: the only writers of the fields named in the class docstring ---------
    def admit(self, handle: int, node: object, prefix: list[int], loading: bool = False) -> None:
        """Admitted under `handle`: `prefix` (cache-owned, locked through `node` by the adder)
        is its KV so far; its prompt's remaining chunks come through `extend`. `loading`: part
        of `prefix` is loaded in this step, so its first row goes in a later one (`joined`)."""
        self.handle = handle
        self.node = node
        self.cached_len = len(prefix)
        self.kv_slots = list(prefix)
        self.kv_len = len(prefix)
        self.phase = Phase.LOADING if loading else Phase.PREFILL

    def joined(self) -> None:
        """A loading request's first row (its ADMIT) is in the step being built."""
        assert self.phase is Phase.LOADING
        self.phase = Phase.PREFILL

    def extend(self, slots: list[int]) -> bool:
        """The next `len(slots)` tokens of `fill` get these request-owned slots. True when all
        of `fill` then has KV: the request decodes from now on."""
        self.kv_slots.extend(slots)
        self.kv_len += len(slots)
        done = self.kv_len == len(self.fill)
        if done:
            self.phase = Phase.DECODE
        return done

    def decode(self, slot: int) -> None:
        """A decode step writes the next token's KV into `slot`; its sampled token is pending
        (with overlap `kv_len` may then be len(fill) + 1 until the result comes)."""
        self.kv_slots.append(slot)
        self.kv_len += 1
        self.pending += 1

    @staticmethod
    def decode_all(reqs: list[Request], slots: list[int]) -> None:
        """`decode` for each request with its slot: a step's decode rows in one call (it runs
        for every running request every step; a method call per row cost more than its work)."""
        for r, slot in zip(reqs, slots, strict=True):
            r.kv_slots.append(slot)
            r.kv_len += 1
            r.pending += 1

    def sampling_sent(self) -> None:
        """An admit or extend row of a sent step samples this request's next token."""
        self.pending += 1

    def sample_settled(self) -> None:
        """A pending sample came back, or its row was skipped or dropped."""
        self.pending -= 1

    def undo_decode(self, cache: PrefixCache) -> None:
        """The worker skips this request's last decode (or it was taken out of an unsent
        step): its slot goes back to the pool, as if it never decoded. `pending` is settled by
        whoever accounts the row (`sample_settled`)."""
        cache.free_slots([self.kv_slots.pop()])
        self.kv_len -= 1

    def truncate(self, keep: int, cache: PrefixCache) -> None:
        """Cut the KV back to `fill[:keep]` (a jump-forward's rollback); the cut slots are
        request-owned (`keep >= cached_len`: cached KV is shared and never cut)."""
        assert keep >= self.cached_len, "a truncation into cached KV"
        cache.free_slots(self.kv_slots[keep : self.kv_len])
        del self.kv_slots[keep:]
        self.kv_len = keep

    def cached_prefix(self, node: object, cached_len: int) -> None:
        """The prefix cache took `fill[:cached_len]` (cache_unfinished): those slots are the
        cache's now, locked through `node` (the cache moved the lock)."""
        self.node = node
        self.cached_len = cached_len

    def release(self, cache: PrefixCache, insert: bool) -> None:
        """Give up all KV. `insert`: its computed KV enters the prefix cache (finished, or kept
        for a retry); otherwise its own slots are freed (aborted, failed). The handle is
        dropped; a result of a step built before this no longer applies (`epoch`)."""
        n = self.known_kv  # a decode of a not yet known token (overlap) is dropped
        if insert and n:
            cache.insert(self.cache_keys(n), self.kv_slots[:n])
            extra = self.kv_slots[n:]
            if extra:
                cache.free_slots(extra)
        elif self.owned:
            cache.free_slots(self.kv_slots[self.cached_len :])
        if self.node is not None:
            cache.unlock(self.node)
            self.node = None
        self.handle = -1
        self.kv_slots = []
        self.pending = 0
        self.epoch += 1
        self.cached_len = 0
        self.kv_len = 0
        self.phase = Phase.DONE

    def requeue(self) -> None:
        """Released and waiting again (retracted, redone after a jump, or a continuation):
        matched and admitted anew."""
        assert self.phase is Phase.DONE and not self.kv_slots, "requeue after release"
        self.phase = Phase.WAITING
        self.match = None

    def offer_jump(self, jump: tuple[int, list[int]]) -> None:
        """The grammar forces text here: (rollback, tokens), applied by the next build."""
        self.jump = jump

    def drop_jump(self) -> None:
        """The pending jump is being applied (or redone from the queue)."""
        self.jump = None

    def mark_no_jump(self) -> None:
        """The position right after a jump does not ask for another."""
        self.no_jump_at = len(self.output)

    def forget_jumps(self) -> None:
        """A continuation after a loss: no jump is pending and any position may ask again."""
        self.jump = None
        self.no_jump_at = -1
