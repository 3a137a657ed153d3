"""The public RadixMesh API (the front door): tokenization, validation, submission to the
scheduler, incremental detokenization, stop strings, coalesced client streams, aborts."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import grpc
import structlog

from radixmesh_server.server import channel
from radixmesh_wire.pb import api_pb2, api_pb2_grpc, scheduler_pb2, scheduler_pb2_grpc
from tokenizer_service.config import TokenizerConfig
from tokenizer_service.deltas import Update
from tokenizer_service.detokenizer import IncrementalDetokenizer
from tokenizer_service.scheduler_link import SchedulerLink, SchedulerLost
from tokenizer_service.stop_strings import StopMatcher
from tokenizer_service.tokenization import Tokenization
from tokenizer_service.validation import (
    InvalidRequest,
    check_input_ids,
    check_text_size,
    normalize_sampling,
)

log = structlog.get_logger(__name__)

INLINE_TOKENIZE_CHARS = 4096  # shorter inputs are tokenized on the loop (tens of microseconds)


class RadixMeshServicer(api_pb2_grpc.RadixMeshServicer):
    def __init__(self, cfg: TokenizerConfig, tok: Tokenization, link: SchedulerLink) -> None:
        self.cfg = cfg
        self.tok = tok
        self.link = link
        self._tok_pool = ThreadPoolExecutor(cfg.tokenize_threads, thread_name_prefix="tokenize")
        self._stats_chan = channel(cfg.scheduler_address)
        self.sched_stub = scheduler_pb2_grpc.SchedulerStub(self._stats_chan)

    @property
    def context_length(self) -> int:
        h = self.link.hello
        return int(h.context_length) if h and h.context_length else 4096

    async def _off_loop(self, fn: Callable[..., list[int]], *args: Any) -> list[int]:
        """Run a tokenization in the tokenizer pool: 10 MB of text takes seconds, which on the
        loop would stall every other request."""
        return await asyncio.get_running_loop().run_in_executor(self._tok_pool, fn, *args)

    def _text_limit(self) -> int:
        """Characters one request may bring: the flag, or fewer when even the longest tokens
        could not fit the context window (a text of n chars has >= n / max_token_chars)."""
        return min(self.cfg.max_input_chars, self.context_length * self.tok.max_token_chars)

    async def _encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        check_text_size(len(text), self._text_limit())
        if len(text) <= INLINE_TOKENIZE_CHARS:  # microseconds: not worth a thread hop
            return self.tok.encode(text, add_special_tokens)
        return await self._off_loop(self.tok.encode, text, add_special_tokens)

    async def _prompt_ids(self, req: api_pb2.GenerateRequest) -> list[int]:
        kind = req.WhichOneof("input")
        if kind == "text":
            return await self._encode(req.text)
        if kind == "input_ids":
            ids = list(req.input_ids.ids)
            check_input_ids(ids, self.tok.vocab_size)
            return ids
        if kind == "chat":
            return await self._chat_ids(req.chat)
        raise InvalidRequest("no input: set text, input_ids or chat")

    async def _chat_ids(self, chat: api_pb2.ChatMessages) -> list[int]:
        if not chat.messages:
            raise InvalidRequest("chat has no messages")
        msgs = [{"role": m.role, "content": m.content} for m in chat.messages]
        chars = sum(len(m["content"]) + len(m["role"]) for m in msgs)
        check_text_size(chars, self._text_limit(), "the chat")
        gen = chat.add_generation_prompt if chat.HasField("add_generation_prompt") else True
        try:
            if chars <= INLINE_TOKENIZE_CHARS:
                return self.tok.apply_chat(msgs, gen)
            return await self._off_loop(self.tok.apply_chat, msgs, gen)
        except Exception as exc:  # template errors (bad roles, order) are the caller's to fix
            raise InvalidRequest(f"chat template rejected the messages: {exc}") from exc

    async def Generate(
        self, request: api_pb2.GenerateRequest, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[api_pb2.GenerateResponse]:
        rid = request.request_id or uuid.uuid4().hex
        try:
            ids = await self._prompt_ids(request)
            sampling = normalize_sampling(
                request.sampling,
                request.logprobs,
                len(ids),
                self.context_length,
                self.tok.vocab_size,
                self.cfg.default_max_new_tokens,
                self.cfg.max_top_logprobs,
            )
        except InvalidRequest as exc:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
            return
        submit = scheduler_pb2.SubmitRequest(
            rid=rid,
            input_ids=ids,
            sampling=sampling,
            logprobs=request.logprobs,
            eos_token_ids=[] if sampling.ignore_eos else self.tok.eos_ids,
        )
        try:
            queue = self.link.submit(submit)
        except SchedulerLost as exc:
            await context.abort(grpc.StatusCode.UNAVAILABLE, str(exc))
            return
        log.debug("submitted", rid=rid, prompt_tokens=len(ids))
        stream = _Stream(self, rid, ids, request, sampling)
        finished = False
        try:
            while True:
                item = await queue.get()
                if isinstance(item, Exception):
                    await context.abort(grpc.StatusCode.UNAVAILABLE, str(item))
                    return
                ex = item.extras
                if ex is not None and ex.error_code:
                    finished = True
                    await context.abort(grpc.StatusCode(_code(ex.error_code)), ex.error_message)
                    return
                chunk, done = stream.on_delta(item)
                if chunk is not None:
                    yield api_pb2.GenerateResponse(request_id=rid, chunk=chunk)
                if done:
                    finished = True
                    if stream.stopped_by_string:
                        self.link.abort(rid, submit.key)
                    yield api_pb2.GenerateResponse(request_id=rid, complete=stream.complete())
                    return
        finally:
            if not finished:  # client cancelled, deadline passed or the stream broke
                self.link.abort(rid, submit.key)
            self.link.done(rid, submit.key)

    async def Tokenize(
        self, request: api_pb2.TokenizeRequest, context: grpc.aio.ServicerContext
    ) -> api_pb2.TokenizeResponse:
        try:
            if request.WhichOneof("input") == "chat":
                return api_pb2.TokenizeResponse(ids=await self._chat_ids(request.chat))
            return api_pb2.TokenizeResponse(
                ids=await self._encode(request.text, request.add_special_tokens)
            )
        except InvalidRequest as exc:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
            raise

    async def Detokenize(
        self, request: api_pb2.DetokenizeRequest, context: grpc.aio.ServicerContext
    ) -> api_pb2.DetokenizeResponse:
        try:
            check_input_ids(list(request.ids), self.tok.vocab_size)
        except InvalidRequest as exc:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
        return api_pb2.DetokenizeResponse(
            text=self.tok.decode(request.ids, request.skip_special_tokens)
        )

    async def Abort(
        self, request: api_pb2.AbortRequest, context: grpc.aio.ServicerContext
    ) -> api_pb2.AbortResponse:
        return api_pb2.AbortResponse(found=self.link.request_abort(request.request_id))

    async def GetModelInfo(
        self, request: api_pb2.GetModelInfoRequest, context: grpc.aio.ServicerContext
    ) -> api_pb2.ModelInfo:
        t = self.tok
        info = api_pb2.ModelInfo(
            model_name=t.model_name,
            context_length=self.context_length,
            vocab_size=t.vocab_size,
            eos_token_ids=t.eos_ids,
            bos_token_id=t.bos_id,
            default_system_prompt=t.roles.default_system_prompt,
            generation_prefix=t.roles.generation_prefix,
            chat_template=t.chat_template,
        )
        for role, (prefix, suffix) in t.roles.roles.items():
            info.roles[role].prefix = prefix
            info.roles[role].suffix = suffix
        return info

    async def GetStats(
        self, request: api_pb2.GetStatsRequest, context: grpc.aio.ServicerContext
    ) -> api_pb2.Stats:
        try:
            stats = await self.sched_stub.GetStats(api_pb2.GetStatsRequest(), timeout=5)
        except grpc.aio.AioRpcError as exc:
            await context.abort(grpc.StatusCode.UNAVAILABLE, f"scheduler: {exc.details()}")
            raise
        stats.frontend_inflight = len(self.link.queues)
        return stats


def _code(value: int) -> int:
    for c in grpc.StatusCode:
        if c.value[0] == value:
            return c  # type: ignore[return-value]
    return grpc.StatusCode.INTERNAL  # type: ignore[return-value]


class _Stream:
    """Per-request text assembly: detokenize, watch stop strings, coalesce chunks."""

    def __init__(
        self,
        svc: RadixMeshServicer,
        rid: str,
        prompt: list[int],
        req: api_pb2.GenerateRequest,
        sampling: api_pb2.SamplingParams,
    ) -> None:
        self.svc = svc
        self.req = req
        self.prompt_len = len(prompt)
        self.prompt_tail = prompt[-8:]
        skip = sampling.skip_special_tokens
        self.detok = IncrementalDetokenizer(
            lambda ids: svc.tok.decode(ids, skip_special_tokens=skip), self.prompt_tail
        )
        self.stops = StopMatcher(list(sampling.stop))
        self.interval = max(req.stream_interval, 1) if req.HasField("stream_interval") else 1
        self.ids: list[int] = []
        self.logprobs: list[api_pb2.TokenLogprob] = []
        self.prompt_logprobs: list[api_pb2.TokenLogprob] = []
        self.text = ""  # text so far, cut at a stop string once matched
        self.emitted = 0  # chars of text already streamed
        self.unsent_ids: list[int] = []
        self.unsent_lps: list[api_pb2.TokenLogprob] = []
        self.cached = 0
        self.finish = api_pb2.FINISH_REASON_UNSPECIFIED
        self.matched_stop = ""
        self.stopped_by_string = False

    def on_delta(self, u: Update) -> tuple[api_pb2.GenerateChunk | None, bool]:
        ex = u.extras
        if u.rollback:
            self._rollback(u.rollback)
        self.ids.extend(u.token_ids)
        self.unsent_ids.extend(u.token_ids)
        old = len(self.text)
        self.text += self.detok.push(u.token_ids)
        done = False
        if ex is not None:
            if ex.HasField("cached_tokens"):
                self.cached = ex.cached_tokens
            self.prompt_logprobs.extend(ex.prompt_logprobs)
            self.logprobs.extend(ex.logprobs)
            self.unsent_lps.extend(ex.logprobs)
            done = ex.finish_reason != api_pb2.FINISH_REASON_UNSPECIFIED
            if done:
                self.text += self.detok.flush()
                self.finish = ex.finish_reason
                if ex.HasField("matched_stop_token"):
                    self.matched_stop = str(ex.matched_stop_token)
        hit = self.stops.find(self.text, old)
        if hit is not None:
            self.text = self.text[: hit[0]]
            self.finish = api_pb2.FINISH_REASON_STOP
            self.matched_stop = hit[1]
            self.stopped_by_string = not done
            done = True
        return self._chunk(done), done

    def _rollback(self, n: int) -> None:
        """Jump-forward retokenized the tail: drop n tokens. Their text is a prefix of what the
        replacement tokens spell, so text already streamed stays valid; we re-derive the
        detokenizer state from the kept ids and let the new tokens extend it."""
        del self.ids[len(self.ids) - n :]
        del self.logprobs[len(self.logprobs) - min(n, len(self.logprobs)) :]
        drop = min(n, len(self.unsent_ids))
        del self.unsent_ids[len(self.unsent_ids) - drop :]
        self.detok = IncrementalDetokenizer(self.detok.decode, self.prompt_tail)
        self.detok.push(self.ids)
        self.text = self.detok.text

    def _chunk(self, done: bool) -> api_pb2.GenerateChunk | None:
        if not self.req.stream:
            return None
        if not done and len(self.unsent_ids) < self.interval:
            return None
        safe = len(self.text) if done else self.stops.safe_length(self.text)
        if safe <= self.emitted and not self.unsent_ids:
            return None
        chunk = api_pb2.GenerateChunk(
            text=self.text[self.emitted : safe], token_ids=self.unsent_ids, logprobs=self.unsent_lps
        )
        self.emitted = max(self.emitted, safe)
        self.unsent_ids, self.unsent_lps = [], []
        return chunk

    def complete(self) -> api_pb2.GenerateComplete:
        lp = self.req.logprobs
        return api_pb2.GenerateComplete(
            text=self.text,
            output_ids=self.ids,
            finish_reason=self.finish,
            matched_stop=self.matched_stop,
            prompt_tokens=self.prompt_len,
            completion_tokens=len(self.ids),
            cached_tokens=self.cached,
            output_logprobs=self.logprobs,
            prompt_logprobs=self.prompt_logprobs,
            # position 0 has no logprob (nothing precedes it), so scores start at max(p, 1)
            prompt_logprobs_from=max(lp.prompt_logprobs_from, 1)
            if lp.HasField("prompt_logprobs_from")
            else 0,
        )
