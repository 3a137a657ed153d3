"""One Masks step: decode the message, apply it to a session's matchers, build the reply.

`parse_step` runs on the event loop (cheap); `MaskEngine.run` is the heavy part and runs in the
mask pool: xgrammar releases the GIL while it fills bitmasks, so steps of different sessions
overlap. The order of operations inside a step is fixed by the proto: releases, binds (with
replay), rollbacks, accepts, then masks (and jump-forward proposals) for `mask_handles`.

Invariants:
- `reply.rows[i]` answers `mask_handles[i]`: the reply always has one row per wanted handle.
- A handle with any error this step gets a NONE row (never a stale mask) and a RowError.
- A terminated matcher (stop token accepted) gets a row allowing only the stop tokens.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import cast

import numpy as np
import structlog
import xgrammar as xgr

from grammar_service.jump_forward import Retokenizer
from grammar_service.kinds import GrammarKey, GrammarKind
from grammar_service.matchers import ErrorCode, MatchError, MatcherTable, RequestMatcher
from radixmesh_wire.mask_rows import EncodedRow, bitmask_words, encode_ids, encode_rows
from radixmesh_wire.pb import grammar_pb2 as pb

_I32 = np.dtype("<i4")
log = structlog.get_logger(__name__)

KIND_FROM_PB: dict[int, GrammarKind] = {
    pb.GRAMMAR_KIND_JSON_SCHEMA: GrammarKind.JSON_SCHEMA,
    pb.GRAMMAR_KIND_REGEX: GrammarKind.REGEX,
    pb.GRAMMAR_KIND_EBNF: GrammarKind.EBNF,
}


def grammar_key(spec: pb.GrammarSpec) -> GrammarKey:
    kind = KIND_FROM_PB.get(spec.kind)
    if kind is None:
        raise ValueError(f"grammar kind {spec.kind} is not json_schema, regex or ebnf")
    return kind, spec.text


class StepFormatError(ValueError):
    """A malformed MaskStep (a scheduler bug): the server ends the stream with INVALID_ARGUMENT."""


def _ints(data: bytes, what: str) -> list[int]:
    if len(data) % 4:
        raise StepFormatError(f"{what}: {len(data)} bytes is not a whole number of int32")
    return np.frombuffer(data, dtype=_I32).tolist()


@dataclass(slots=True)
class BindOp:
    handle: int
    key: GrammarKey | None  # None: the kind was invalid (reported as a COMPILE error)
    replay: list[int]
    error: str = ""
    rid: str = ""  # the request's id, for log lines about it


@dataclass(slots=True)
class StepOps:
    step_id: int
    releases: list[int] = field(default_factory=list)
    binds: list[BindOp] = field(default_factory=list)
    rollbacks: list[tuple[int, int]] = field(default_factory=list)
    accepts: list[tuple[int, list[int]]] = field(default_factory=list)
    mask_handles: list[int] = field(default_factory=list)
    jump_forward: set[int] = field(default_factory=set)

    def weight(self) -> int:
        """A rough cost: rows to fill plus tokens to accept or replay."""
        replay = sum(len(b.replay) for b in self.binds)
        return len(self.mask_handles) + sum(len(t) for _, t in self.accepts) + replay


def _handles(data: bytes, what: str) -> list[int]:
    """Handles are uint32 on the wire (MaskRow.handle, RowError.handle): a negative one in a
    packed array could not even be answered, so the step is malformed."""
    hs = _ints(data, what)
    if hs and min(hs) < 0:
        raise StepFormatError(f"{what}: negative handle {min(hs)}")
    return hs


def parse_step(msg: pb.MaskStep) -> StepOps:
    """Decode a MaskStep; malformed packing raises StepFormatError."""
    ops = StepOps(step_id=msg.step_id, releases=_handles(msg.release_handles, "release_handles"))
    for b in msg.binds:
        try:
            key: GrammarKey | None = grammar_key(b.grammar)
            error = ""
        except ValueError as exc:
            key, error = None, str(exc)
        replay = _ints(b.replay_tokens, "replay_tokens")
        ops.binds.append(BindOp(b.handle, key, replay, error, b.rid))
    ops.rollbacks = [(r.handle, r.num_tokens) for r in msg.rollbacks]
    handles = _handles(msg.accept_handles, "accept_handles")
    tokens = _ints(msg.accept_tokens, "accept_tokens")
    counts = _ints(msg.accept_counts, "accept_counts") if msg.accept_counts else [1] * len(handles)
    if len(counts) != len(handles) or sum(counts) != len(tokens) or min(counts, default=0) < 0:
        raise StepFormatError(
            f"accepts: {len(handles)} handles, {len(counts)} counts summing to {sum(counts)}, "
            f"{len(tokens)} tokens"
        )
    pos = 0
    for h, c in zip(handles, counts, strict=True):
        ops.accepts.append((h, tokens[pos : pos + c]))
        pos += c
    ops.mask_handles = _handles(msg.mask_handles, "mask_handles")
    ops.jump_forward = set(_handles(msg.jump_forward_handles, "jump_forward_handles"))
    return ops


class MaskEngine:
    """Stateless across sessions: vocabulary facts, the retokenizer and fill policy. Each
    session brings its own `SessionState` (matchers, bitmask buffer, batch filler)."""

    def __init__(
        self,
        tokenizer_info: xgr.TokenizerInfo,
        retokenizer: Retokenizer | None,
        *,
        stop_token_ids: list[int],
        batch_fill_min_rows: int = 32,
        fill_threads: int = 2,
    ) -> None:
        self.vocab_size = int(tokenizer_info.vocab_size)
        self.words = bitmask_words(self.vocab_size)
        self.stop_token_ids = stop_token_ids
        self.retokenizer = retokenizer
        self.batch_fill_min_rows = batch_fill_min_rows
        self.fill_threads = fill_threads
        self._stop_row = encode_ids(stop_token_ids, self.vocab_size)

    def run(
        self,
        state: SessionState,
        ops: StepOps,
        compiled: Mapping[GrammarKey, xgr.CompiledGrammar | str],
        stages: dict[str, float] | None = None,
    ) -> pb.MaskStepResult:
        """Apply one step to `state` and return the result (service_ms is left to the caller).
        `compiled` maps every bind's key to its grammar or its compile error message.
        `stages`, when given, gets seconds per stage added (accept, fill, encode,
        jump_forward): the load test's breakdown; a few perf_counter calls per step."""
        t0 = time.perf_counter()
        table = state.table
        errors: dict[int, pb.RowError] = {}
        for h in ops.releases:
            table.release(h)
        for b in ops.binds:
            try:
                got = compiled.get(b.key) if b.key is not None else b.error
                if got is None or isinstance(got, str):
                    raise MatchError(ErrorCode.COMPILE, got or "grammar was not compiled")
                table.bind(b.handle, b.key, got, b.replay)  # type: ignore[arg-type]
            except Exception as err:
                _fail(errors, b.handle, err)
        for h, n in ops.rollbacks:
            try:
                table.get(h).rollback(n)
            except Exception as err:
                _fail(errors, h, err)
        for h, toks in ops.accepts:
            if h in errors:
                continue  # e.g. its bind failed: the accept would only add a second error
            try:
                table.get(h).accept(toks)
            except Exception as err:
                _fail(errors, h, err)
        if stages is not None:
            stages["accept"] = stages.get("accept", 0.0) + time.perf_counter() - t0
        rows = self._masks(state, ops, errors, stages)
        return pb.MaskStepResult(step_id=ops.step_id, rows=rows, errors=list(errors.values()))

    def _masks(
        self,
        state: SessionState,
        ops: StepOps,
        errors: dict[int, pb.RowError],
        stages: dict[str, float] | None,
    ) -> list[pb.MaskRow]:
        t0 = time.perf_counter()
        wanted: list[RequestMatcher | None] = []
        for h in ops.mask_handles:
            m = None
            if h not in errors:
                try:
                    m = state.table.get(h)
                except MatchError as err:
                    _fail(errors, h, err)
            wanted.append(m)
        live = [i for i, m in enumerate(wanted) if m is not None and not m.terminated]
        buf = state.buffer(len(live), self.words)
        self._fill(state, [wanted[i] for i in live], buf)  # type: ignore[misc]
        t1 = time.perf_counter()
        jf_s = 0.0
        encoded = encode_rows(buf, self.vocab_size) if live else []
        can_end = self._can_end(buf)
        slot = {row: j for j, row in enumerate(live)}
        rows: list[pb.MaskRow] = []
        for i, (h, m) in enumerate(zip(ops.mask_handles, wanted, strict=True)):
            if m is None:
                rows.append(pb.MaskRow(handle=h, encoding=pb.MASK_ENCODING_NONE))
                continue
            j = slot.get(i)
            if j is None:  # terminated
                rows.append(_row(h, self._stop_row, terminated=True, can_end=True))
                continue
            row = _row(h, encoded[j], terminated=False, can_end=bool(can_end[j]))
            if h in ops.jump_forward and self.retokenizer is not None:
                tj = time.perf_counter()
                try:
                    jf = self.retokenizer.propose(m, buf[j])
                except Exception:  # a missed jump costs one decode step; never the stream
                    log.exception("jump_forward_failed", handle=h)
                    jf = None
                if jf is not None:
                    row.jump_forward.text = jf.text
                    row.jump_forward.rollback = jf.rollback
                    row.jump_forward.tokens = np.asarray(jf.tokens, dtype=_I32).tobytes()
                jf_s += time.perf_counter() - tj
            rows.append(row)
        if stages is not None:
            t2 = time.perf_counter()
            for k, v in (("fill", t1 - t0), ("encode", t2 - t1 - jf_s), ("jump_forward", jf_s)):
                stages[k] = stages.get(k, 0.0) + v
        return rows

    def _fill(self, state: SessionState, matchers: list[RequestMatcher], buf: np.ndarray) -> None:
        # Small batches: a plain loop is faster than xgrammar's batch call (thread fan-out
        # costs ~80 us on two cores); large ones spread over `fill_threads` threads.
        if len(matchers) >= self.batch_fill_min_rows:
            state.batch_matcher(self.fill_threads).batch_fill_next_token_bitmask(
                [m.matcher for m in matchers], buf
            )
        else:
            for j, m in enumerate(matchers):
                m.fill(buf, j)

    def _can_end(self, buf: np.ndarray) -> np.ndarray:
        words = buf.view(np.uint32)
        out = np.zeros(buf.shape[0], dtype=bool)
        for s in self.stop_token_ids:
            out |= ((words[:, s >> 5] >> np.uint32(s & 31)) & np.uint32(1)).astype(bool)
        return out


def _fail(errors: dict[int, pb.RowError], handle: int, err: Exception) -> None:
    """Record a handle's first error (the one that matters). Anything but a MatchError is a
    fault of this row's grammar state (or ours): it fails this request alone, as INTERNAL."""
    if not isinstance(err, MatchError):
        log.error("row_failed", handle=handle, error=repr(err))
        err = MatchError(ErrorCode.INTERNAL, f"grammar service error: {err!r}")
    if handle not in errors:
        errors[handle] = pb.RowError(
            handle=handle,
            code=cast("pb.GrammarErrorCode", int(err.code)),
            message=str(err),
            accepted=err.accepted,
        )


def _row(h: int, enc: EncodedRow, *, terminated: bool, can_end: bool) -> pb.MaskRow:
    return pb.MaskRow(
        handle=h,
        encoding=cast("pb.MaskEncoding", int(enc.encoding)),
        data=enc.data,
        terminated=terminated,
        can_end=can_end,
    )


class SessionState:
    """Everything one Masks stream owns. Touched by one thread at a time (see matchers.py)."""

    def __init__(self, session_id: str, *, max_rollback_tokens: int, keep_tokens: int) -> None:
        self.session_id = session_id
        self.table = MatcherTable(max_rollback_tokens=max_rollback_tokens, keep_tokens=keep_tokens)
        self._buf = np.zeros((0, 0), dtype=_I32)
        self._batch: xgr.BatchGrammarMatcher | None = None
        self.steps = 0

    def buffer(self, rows: int, words: int) -> np.ndarray:
        """A [rows, words] int32 view of a reused buffer (grown by doubling)."""
        if self._buf.shape[0] < rows or self._buf.shape[1] != words:
            self._buf = np.zeros((max(rows, 2 * self._buf.shape[0], 8), words), dtype=_I32)
        return self._buf[:rows]

    def batch_matcher(self, threads: int) -> xgr.BatchGrammarMatcher:
        if self._batch is None:
            self._batch = xgr.BatchGrammarMatcher(max_threads=threads)
        return self._batch
