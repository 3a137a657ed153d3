"""The front door's transport-neutral core: one request lifecycle under both public APIs.

A `GenerateInput` (plain fields) goes in; an async stream of `Chunk`s and one final `Complete`
comes out, or a `GenerateError` with a status. The core validates, tokenizes (text, ids or chat
through the template), submits to the scheduler, detokenizes incrementally, applies stop
strings and coalescing, and aborts the request when the consumer stops iterating (client
disconnect, deadline, cancellation). The gRPC servicer and the HTTP handlers only translate.

Lifecycle invariant: every submitted request leaves the `ReplicaSet` (done) when its generator
ends, and is aborted at its scheduler unless it finished there. Which replica runs it is the
replica set's business (routing, failover): the core holds only its `Ticket`.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncGenerator, Callable
from concurrent.futures import ThreadPoolExecutor
from contextlib import aclosing
from dataclasses import dataclass, field
from typing import Any

import grpc
import structlog

from radixmesh_wire.images import ImageInput
from radixmesh_wire.pb import api_pb2, scheduler_pb2
from radixmesh_wire.step_codec import image_to_proto
from tokenizer_service.auth import cache_namespace
from tokenizer_service.config import TokenizerConfig
from tokenizer_service.events import Chunk, Complete, Event
from tokenizer_service.images import ImageBounds, ImageSpec, place, prepare
from tokenizer_service.metrics import FrontDoorMetrics, RequestTimer
from tokenizer_service.pacing import Pacer
from tokenizer_service.routing.deltas import Update
from tokenizer_service.routing.replica_set import ReplicaSet, Ticket
from tokenizer_service.routing.scheduler_link import DuplicateRequest, SchedulerLost
from tokenizer_service.text_stream import TextStream
from tokenizer_service.tokenization import Tokenization
from tokenizer_service.validation import (
    InvalidRequest,
    check_chat_roles,
    check_input_ids,
    check_resume,
    check_text_size,
    normalize_sampling,
)

log = structlog.get_logger(__name__)

FALLBACK_CONTEXT = 4096  # the window assumed while no replica has a model connected
INLINE_TOKENIZE_CHARS = 4096  # shorter inputs are tokenized on the loop (tens of microseconds)


class GenerateError(Exception):
    """A request that cannot be served; `status` says why in gRPC's vocabulary."""

    def __init__(self, status: grpc.StatusCode, message: str, field: str = "") -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.field = field  # the request field at fault (gRPC API's name), "" when none


@dataclass
class GenerateInput:
    """Exactly one of text, input_ids, messages. `sampling` and `logprobs` are the public API's
    messages: they go to the scheduler as they are once validated."""

    rid: str = ""
    text: str | None = None
    input_ids: list[int] | None = None
    messages: list[dict[str, Any]] | None = None
    tools: list[dict[str, Any]] | None = None  # OpenAI tool definitions the template renders
    add_generation_prompt: bool = True
    sampling: api_pb2.SamplingParams = field(default_factory=api_pb2.SamplingParams)
    logprobs: api_pb2.LogprobOptions = field(default_factory=api_pb2.LogprobOptions)
    stream: bool = False
    stream_interval: int = 1
    tenant: str = ""  # the caller's (API key's) tenant; "" when keys are off
    cache_salt: str = ""  # prefix-cache isolation within the tenant
    # A continuation (the client library's retry after a broken stream): the output ids the
    # client already has; generation continues after them and chunks carry only what is new.
    resume_output_ids: list[int] = field(default_factory=list)
    # Images (encoded bytes), one per image marker of the prompt, in order (multimodal
    # models); `FrontDoor.prepare` turns them into `image_inputs` and the prompt's markers
    # into their positions, once (a prepared input keeps both: its ids hold pseudo ids).
    images: list[bytes] = field(default_factory=list)
    image_inputs: list[ImageInput] = field(default_factory=list)


@dataclass
class _Run:
    """One submitted request while its events stream (core.FrontDoor.generate)."""

    ticket: Ticket
    stream: TextStream
    wire_rid: str
    owns: bool  # it holds its id in `owners` (a refused duplicate does not)
    finished: bool = False  # ended at its scheduler: nothing to abort


class FrontDoor:
    def __init__(
        self,
        cfg: TokenizerConfig,
        tok: Tokenization,
        replicas: ReplicaSet,
        metrics: FrontDoorMetrics | None = None,
    ) -> None:
        self.cfg = cfg
        self.tok = tok
        self.replicas = replicas
        self.metrics = metrics or FrontDoorMetrics()
        self._tok_pool = ThreadPoolExecutor(cfg.tokenize_threads, thread_name_prefix="tokenize")
        self.owners: dict[str, str] = {}  # live request (scheduler rid) -> its tenant
        # fewer, fuller events when many streams are live or the loop runs late (pacing.py)
        self.pacer = Pacer(
            events_per_s=cfg.pacing_events_per_s, max_hold_s=cfg.pacing_max_hold_ms / 1000
        )
        self.image_spec = ImageSpec.from_folder(tok.folder)  # None: a text-only model
        self.image_bounds = ImageBounds(cfg.max_image_bytes, cfg.max_image_pixels, cfg.max_images)
        if self.image_spec is not None:  # chat content keeps the image marker (tokenization)
            tok.image_marker = (self.image_spec.image_token, self.image_spec.image_token_id)

    @property
    def context_length(self) -> int:
        """The connected model's window; before any model was reported, FALLBACK_CONTEXT
        (a request then is checked again by the scheduler once the model connects)."""
        return self.replicas.context_length or FALLBACK_CONTEXT

    @property
    def ready(self) -> bool:
        return self.replicas.ready

    def _text_limit(self) -> int:
        """Characters one request may bring: the flag, or fewer when even the longest tokens
        could not fit the context window (a text of n chars has >= n / max_token_chars)."""
        return min(self.cfg.max_input_chars, self.context_length * self.tok.max_token_chars)

    async def _off_loop(self, fn: Callable[..., list[int]], *args: Any) -> list[int]:
        """Run a tokenization in the tokenizer pool: megabytes of text take seconds, which on
        the loop would stall every other request."""
        return await asyncio.get_running_loop().run_in_executor(self._tok_pool, fn, *args)

    async def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        check_text_size(len(text), self._text_limit())
        if len(text) <= INLINE_TOKENIZE_CHARS:  # microseconds: not worth a thread hop
            return self.tok.encode(text, add_special_tokens)
        return await self._off_loop(self.tok.encode, text, add_special_tokens)

    async def prompt_ids(self, inp: GenerateInput) -> list[int]:
        if inp.text is not None:
            return await self.encode(inp.text)
        if inp.input_ids is not None:
            if inp.image_inputs:  # prepared before: its image positions hold pseudo ids
                return list(inp.input_ids)
            check_input_ids(inp.input_ids, self.tok.vocab_size)
            return list(inp.input_ids)
        if inp.messages is not None:
            return await self.chat_ids(inp.messages, inp.add_generation_prompt, inp.tools)
        raise InvalidRequest("no input: set text, input_ids or chat messages")

    async def chat_ids(
        self,
        messages: list[dict[str, Any]],
        add_generation_prompt: bool,
        tools: list[dict[str, Any]] | None = None,
    ) -> list[int]:
        if not messages:
            raise InvalidRequest("chat has no messages")
        # OpenAI's `developer` role is the system prompt of newer models: `system` here.
        messages = [
            {**m, "role": "system"} if m.get("role") == "developer" else m for m in messages
        ]
        check_chat_roles([m.get("role", "") for m in messages])
        chars = sum(len(m.get("content", "")) + len(m.get("role", "")) for m in messages)
        check_text_size(chars, self._text_limit(), "the chat")
        try:
            if chars <= INLINE_TOKENIZE_CHARS and not tools:
                return self.tok.apply_chat(messages, add_generation_prompt, tools)
            return await self._off_loop(self.tok.apply_chat, messages, add_generation_prompt, tools)
        except Exception as exc:  # template errors (bad roles, order) are the caller's to fix
            raise InvalidRequest(f"chat template rejected the messages: {exc}") from exc

    async def tokenize_in_place(self, inp: GenerateInput) -> list[int]:
        """Validate `inp` and replace its text or messages by their ids, so that running it
        later does not tokenize again; raises GenerateError(INVALID_ARGUMENT)."""
        ids, _ = await self.prepare(inp)
        inp.text, inp.messages, inp.input_ids = None, None, ids
        return ids

    async def prepare(self, inp: GenerateInput) -> tuple[list[int], api_pb2.SamplingParams]:
        """Tokenize and validate; raises GenerateError(INVALID_ARGUMENT)."""
        try:
            ids = await self.prompt_ids(inp)
            if inp.images and not inp.image_inputs:
                ids = await self._place_images(inp, ids)
            sampling = normalize_sampling(
                inp.sampling,
                inp.logprobs,
                len(ids),
                self.context_length,
                self.tok.vocab_size,
                self.cfg.default_max_new_tokens,
                self.cfg.max_top_logprobs,
            )
        except InvalidRequest as exc:
            raise GenerateError(grpc.StatusCode.INVALID_ARGUMENT, str(exc), exc.field) from exc
        return ids, sampling

    async def _place_images(self, inp: GenerateInput, ids: list[int]) -> list[int]:
        """Decode and preprocess the images in the tokenizer pool (milliseconds each, off the
        loop), then expand the prompt's markers; sets `inp.image_inputs`."""
        spec = self.image_spec
        if spec is None:
            raise InvalidRequest(
                f"model {self.tok.model_name!r} is text-only: it does not take images", "images"
            )
        n, most = len(inp.images), self.image_bounds.max_images
        if n > most:
            raise InvalidRequest(f"{n} images; at most {most} per request", "images")
        loop = asyncio.get_running_loop()
        jobs = [
            loop.run_in_executor(self._tok_pool, prepare, data, spec, self.image_bounds, i)
            for i, data in enumerate(inp.images)
        ]
        prepared = await asyncio.gather(*jobs)
        ids, inp.image_inputs = place(ids, list(prepared), spec, self.tok.vocab_size)
        return ids

    async def generate(
        self,
        inp: GenerateInput,
        prepared: tuple[list[int], api_pb2.SamplingParams] | None = None,
    ) -> AsyncGenerator[Event, None]:
        """Chunks (when inp.stream) then one Complete; GenerateError on failure. Closing the
        generator early aborts the request. Every log line of the request carries its id, and
        its outcome and latencies go to the front door's metrics."""
        rid = inp.rid or uuid.uuid4().hex
        self.pacer.start()
        structlog.contextvars.bind_contextvars(rid=rid)
        timer = self.metrics.start()
        done: Complete | None = None
        outcome = "cancelled"  # the consumer went away before the end
        try:
            # One generator per request, the event loop inline: every layer of async
            # generators is a resume per event (issue 27).
            run = await self._submit(inp, rid, prepared)
            inbox, stream = run.ticket.queue, run.stream
            try:
                while True:
                    # everything that came since the last event, as one (routing/inbox.py)
                    chunk, ended, tokens, failure = _apply(await inbox.take(), stream)
                    timer.tokens(tokens, inbox.oldest)
                    if failure is not None:
                        error, run.finished = failure  # an error update: the scheduler ended it
                        if chunk is not None:  # tokens before the failure still go out
                            yield chunk
                        raise error
                    if chunk is not None:
                        yield chunk
                    if ended:
                        done, outcome = self._complete(run, inp, timer), "ok"
                        yield done
                        return
            finally:
                self._release(run)
        except GenerateError as exc:
            timer.failed(exc.status.name.lower())
            outcome = exc.status.name.lower()
            raise
        finally:
            timer.close()
            _log_end(rid, inp.tenant, outcome, done, timer)

    async def _submit(
        self,
        inp: GenerateInput,
        rid: str,
        prepared: tuple[list[int], api_pb2.SamplingParams] | None,
    ) -> _Run:
        """Validate, submit to a replica and set up the request's text stream."""
        wire_rid = _wire_rid(rid, inp.tenant)  # request ids are per tenant
        ids, sampling = prepared or await self.prepare(inp)
        resumed = inp.resume_output_ids
        try:
            check_resume(resumed, self.tok.vocab_size, sampling.max_new_tokens)
        except InvalidRequest as exc:
            raise GenerateError(grpc.StatusCode.INVALID_ARGUMENT, str(exc), exc.field) from exc
        submit = scheduler_pb2.SubmitRequest(
            rid=wire_rid,
            input_ids=ids,
            sampling=sampling,
            logprobs=inp.logprobs,
            output_ids=resumed,
            eos_token_ids=[] if sampling.ignore_eos else self.tok.eos_ids,
            cache_namespace=cache_namespace(inp.tenant, inp.cache_salt),
            images=[image_to_proto(im) for im in inp.image_inputs],
        )
        try:
            ticket = self.replicas.submit(submit)
        except SchedulerLost as exc:
            raise GenerateError(grpc.StatusCode.UNAVAILABLE, str(exc)) from exc
        except DuplicateRequest as exc:  # the running one keeps its id (and stays abortable)
            raise GenerateError(
                grpc.StatusCode.ALREADY_EXISTS,
                f"request {rid!r} is running: use another request_id",
            ) from exc
        log.debug("submitted", rid=rid, prompt_tokens=len(ids), resumed=len(resumed))
        stream = TextStream(self.tok, ids, sampling, inp.stream, inp.stream_interval)
        stream.resume(resumed)
        owns = wire_rid not in self.owners  # a duplicate id must not take over the first
        if owns:
            self.owners[wire_rid] = inp.tenant
        ticket.queue.pacer = self.pacer  # tokens gather until the stream may send (pacing.py)
        return _Run(ticket, stream, wire_rid, owns)

    def _complete(self, run: _Run, inp: GenerateInput, timer: RequestTimer) -> Complete:
        run.finished = True
        if run.stream.stopped_by_string:
            self.replicas.abort(run.ticket)
        complete = run.stream.complete(inp.logprobs)
        timer.succeeded(complete.finish_reason, len(complete.prompt_ids), len(complete.output_ids))
        return complete

    def _release(self, run: _Run) -> None:
        run.ticket.queue.close()  # no longer a live stream for the pacer
        if not run.finished:  # the consumer went away, or the stream broke
            self.replicas.abort(run.ticket)
        self.replicas.done(run.ticket)
        if run.owns:
            del self.owners[run.wire_rid]

    def abort(self, rid: str, tenant: str) -> bool:
        """Client-initiated abort: only the tenant that submitted a request may abort it;
        others learn nothing of it."""
        wire_rid = _wire_rid(rid, tenant)
        if self.owners.get(wire_rid) != tenant:
            return False
        return self.replicas.request_abort(wire_rid)

    async def run(self, inp: GenerateInput) -> Complete:
        """The whole result of a non-streaming request."""
        # aclosing: the request has ended (and logged its line) when this returns
        async with aclosing(self.generate(inp)) as events:
            async for ev in events:
                if isinstance(ev, Complete):
                    return ev
        raise GenerateError(grpc.StatusCode.INTERNAL, "the request ended without a result")


def _log_end(
    rid: str, tenant: str, outcome: str, done: Complete | None, timer: RequestTimer
) -> None:
    """The one info line per request: who, how much, how it ended and how long it took."""
    now = time.perf_counter()
    ttft = round(timer.first - timer.t0, 4) if timer.first else None
    log.info(
        "request_done",
        rid=rid,
        tenant=tenant,
        outcome=outcome,
        finish_reason=done.finish_reason if done else None,
        prompt_tokens=done.prompt_tokens if done else None,
        output_tokens=done.completion_tokens if done else None,
        cached_tokens=done.cached_tokens if done else None,
        ttft_s=ttft,
        total_s=round(now - timer.t0, 4),
    )


def _apply(
    items: list[Update | Exception], stream: TextStream
) -> tuple[Chunk | None, bool, int, tuple[GenerateError, bool] | None]:
    """Apply what the inbox gave (usually one update: plain tokens merge there) as ONE
    event: (its chunk, done, tokens, the failure that ends the request or None: see
    `_failure`). A consumer that fell behind catches up in one chunk of several tokens; one
    that keeps up sends each update as it comes. Items after the end are not applied."""
    tokens = 0
    last = len(items) - 1
    chunk: Chunk | None = None
    for k, item in enumerate(items):
        failure = _failure(item)
        if failure is not None:
            return stream.held_chunk(), False, tokens, failure
        assert not isinstance(item, Exception)
        tokens += len(item.token_ids)
        chunk, done = stream.on_delta(item, hold=k < last)
        if done:
            return chunk, True, tokens, None
    return chunk, False, tokens, None


def _failure(item: Update | Exception) -> tuple[GenerateError, bool] | None:
    """What ends the request with an error, and whether the scheduler ended it there: a lost
    link (False: it must still be aborted), or an error update (True)."""
    if isinstance(item, Exception):
        return GenerateError(grpc.StatusCode.UNAVAILABLE, str(item)), False
    ex = item.extras
    if ex is not None and ex.error_code:
        return GenerateError(_status(ex.error_code), ex.error_message), True
    return None


def _wire_rid(rid: str, tenant: str) -> str:
    return f"{tenant}:{rid}" if tenant else rid


def _status(value: int) -> grpc.StatusCode:
    for c in grpc.StatusCode:
        if c.value[0] == value:
            return c
    return grpc.StatusCode.INTERNAL
