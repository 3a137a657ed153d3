"""The public gRPC API (RadixMesh service): a translation layer over the front door's core
(tokenizer_service.core), which owns the request lifecycle."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from contextlib import aclosing

import grpc
import structlog

from radixmesh_wire.pb import api_pb2, api_pb2_grpc
from tokenizer_service.auth import ApiKeys, Principal
from tokenizer_service.core import FrontDoor, GenerateError, GenerateInput
from tokenizer_service.events import Chunk, Complete, TokenLogprob
from tokenizer_service.http.errors import REQUEST_ID_RULE, valid_request_id
from tokenizer_service.routing.replica_stats import NoReplicaAnswered, gather_stats
from tokenizer_service.validation import InvalidRequest, check_input_ids

log = structlog.get_logger(__name__)

_FINISH = {
    "stop": api_pb2.FINISH_REASON_STOP,
    "length": api_pb2.FINISH_REASON_LENGTH,
    "abort": api_pb2.FINISH_REASON_ABORT,
}


class RadixMeshServicer(api_pb2_grpc.RadixMeshServicer):
    def __init__(self, core: FrontDoor, keys: ApiKeys | None = None) -> None:
        self.core = core
        self.keys = keys or ApiKeys({})
        self.tok = core.tok

    @property
    def context_length(self) -> int:
        return self.core.context_length

    async def _chat_ids(self, chat: api_pb2.ChatMessages) -> list[int]:
        msgs = [{"role": m.role, "content": m.content} for m in chat.messages]
        gen = chat.add_generation_prompt if chat.HasField("add_generation_prompt") else True
        return await self.core.chat_ids(msgs, gen)

    async def Generate(
        self, request: api_pb2.GenerateRequest, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[api_pb2.GenerateResponse]:
        inp = _input(request)
        inp.tenant = self._tenant(context)
        if not request.request_id:  # the id an HTTP gateway may have put in the metadata
            header = dict(context.invocation_metadata() or ()).get("x-request-id")
            if isinstance(header, str) and header:
                if not valid_request_id(header):
                    await context.abort(
                        grpc.StatusCode.INVALID_ARGUMENT, f"x-request-id must be {REQUEST_ID_RULE}"
                    )
                inp.rid = header
        await context.send_initial_metadata((("x-request-id", inp.rid),))
        try:
            # aclosing: a cancelled call closes the core's generator now, which aborts
            async with aclosing(self.core.generate(inp)) as events:
                async for ev in events:
                    if isinstance(ev, Chunk):
                        # the common chunk is text and ids: no empty fields to build per event
                        chunk = api_pb2.GenerateChunk(text=ev.text, token_ids=ev.token_ids)
                        if ev.logprobs:
                            chunk.logprobs.extend(_lps(ev.logprobs))
                        if ev.rollback:
                            chunk.rollback = ev.rollback
                        yield api_pb2.GenerateResponse(request_id=inp.rid, chunk=chunk)
                    else:
                        complete = _complete(ev)
                        yield api_pb2.GenerateResponse(request_id=inp.rid, complete=complete)
        except GenerateError as exc:
            await context.abort(exc.status, exc.message)

    async def Tokenize(
        self, request: api_pb2.TokenizeRequest, context: grpc.aio.ServicerContext
    ) -> api_pb2.TokenizeResponse:
        try:
            if request.WhichOneof("input") == "chat":
                return api_pb2.TokenizeResponse(ids=await self._chat_ids(request.chat))
            return api_pb2.TokenizeResponse(
                ids=await self.core.encode(request.text, request.add_special_tokens)
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
        tenant = self._tenant(context)
        return api_pb2.AbortResponse(found=self.core.abort(request.request_id, tenant))

    def _tenant(self, context: grpc.aio.ServicerContext) -> str:
        # The interceptor already refused unknown keys; this names the caller's tenant.
        return (self.keys.of_metadata(context.invocation_metadata()) or Principal("")).tenant

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
            return await gather_stats(self.core.replicas)
        except NoReplicaAnswered as exc:
            await context.abort(grpc.StatusCode.UNAVAILABLE, f"scheduler: {exc}")
            raise


def _input(req: api_pb2.GenerateRequest) -> GenerateInput:
    inp = GenerateInput(
        rid=req.request_id or uuid.uuid4().hex,
        sampling=req.sampling,
        logprobs=req.logprobs,
        stream=req.stream,
        stream_interval=req.stream_interval if req.HasField("stream_interval") else 1,
        cache_salt=req.cache_salt,
        resume_output_ids=list(req.resume_output_ids),
        images=list(req.images),
    )
    kind = req.WhichOneof("input")
    if kind == "text":
        inp.text = req.text
    elif kind == "input_ids":
        inp.input_ids = list(req.input_ids.ids)
    elif kind == "chat":
        inp.messages = [{"role": m.role, "content": m.content} for m in req.chat.messages]
        if req.chat.HasField("add_generation_prompt"):
            inp.add_generation_prompt = req.chat.add_generation_prompt
    return inp


def _lps(lps: list[TokenLogprob]) -> list[api_pb2.TokenLogprob]:
    return [
        api_pb2.TokenLogprob(
            token_id=lp.token_id,
            logprob=lp.logprob,
            top=[api_pb2.TopLogprob(token_id=t, logprob=v) for t, v in lp.top],
        )
        for lp in lps
    ]


def _complete(c: Complete) -> api_pb2.GenerateComplete:
    return api_pb2.GenerateComplete(
        text=c.text,
        output_ids=c.output_ids,
        finish_reason=_FINISH[c.finish_reason],
        matched_stop=c.matched_stop,
        prompt_tokens=c.prompt_tokens,
        completion_tokens=c.completion_tokens,
        cached_tokens=c.cached_tokens,
        output_logprobs=_lps(c.output_logprobs),
        prompt_logprobs=_lps(c.prompt_logprobs),
        prompt_logprobs_from=c.prompt_logprobs_from,
    )
