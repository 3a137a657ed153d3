"""OpenAI-compatible endpoints: /v1/chat/completions, /v1/completions, /v1/models.

Handlers parse (openai_params), run the core through fanout, and shape OpenAI's JSON; nothing
here knows about the scheduler.
"""

from __future__ import annotations

import json
import time
import uuid
from typing import Any

import structlog
from aiohttp import web

from tokenizer_service.core import FrontDoor, GenerateError, GenerateInput
from tokenizer_service.events import Chunk, Complete, TokenLogprob
from tokenizer_service.http.errors import (
    REQUEST_ID,
    TENANT,
    HttpError,
    error_response,
    read_json,
)
from tokenizer_service.http.fanout import (
    choice_inputs,
    name_inputs,
    prefill_once,
    run_all,
)
from tokenizer_service.http.openai_frames import TextFrames
from tokenizer_service.http.openai_params import (
    OpenAIRequest,
    openai_error,
    parse_chat,
    parse_completion,
)
from tokenizer_service.http.openai_stream import OpenAIStream
from tokenizer_service.http.tools import StreamedCalls, plan_tools, prepare_messages, reply_calls

log = structlog.get_logger(__name__)


class OpenAIApi:
    def __init__(self, core: FrontDoor, served_names: list[str]) -> None:
        self.core = core
        self.names = served_names
        self.created = int(time.time())  # the models' "created": when this server started

    def routes(self) -> list[web.RouteDef]:
        return [
            web.post("/v1/chat/completions", self.chat),
            web.post("/v1/completions", self.completions),
            web.get("/v1/models", self.models),
            web.get("/v1/models/{model_id:.+}", self.model),  # ids may hold a slash
        ]

    def _card(self, name: str) -> dict[str, Any]:
        return {
            "id": name,
            "object": "model",
            "created": self.created,
            "owned_by": "radixmesh",
            "max_model_len": self.core.context_length,
        }

    async def models(self, request: web.Request) -> web.Response:
        data = [self._card(name) for name in self.names]
        return web.json_response({"object": "list", "data": data})

    async def model(self, request: web.Request) -> web.Response:
        return web.json_response(self._card(self._model(request.match_info["model_id"])))

    async def chat(self, request: web.Request) -> web.StreamResponse:
        return await self._serve(request, chat=True)

    async def completions(self, request: web.Request) -> web.StreamResponse:
        return await self._serve(request, chat=False)

    async def _serve(self, request: web.Request, chat: bool) -> web.StreamResponse:
        try:
            body = await read_json(request)
            req = (
                parse_chat(body) if chat else parse_completion(body, self.core.cfg.max_top_logprobs)
            )
            model = self._model(req.model)
            for inp in req.inputs:
                inp.tenant = request.get(TENANT, "")
            if req.chat is not None:
                self._tools(req)
            rid = request.get(REQUEST_ID) or uuid.uuid4().hex
            name_inputs(rid, req.inputs)
            if not self.core.ready:
                raise HttpError(503, "not ready: the scheduler is not connected", "unavailable")
            inputs, cached = await self._inputs(req)
        except HttpError as err:
            return error_response(err)
        except GenerateError as exc:
            return error_response(openai_error(exc))
        log.debug("openai_request", chat=chat, n=len(inputs), user=req.user)
        shape = Shape(self.core, req, model, chat, cached, rid)
        if req.stream:
            return await OpenAIStream(self.core, inputs, shape).serve(request)
        try:
            results = await run_all(self.core, inputs)
        except GenerateError as exc:
            return error_response(openai_error(exc))
        return web.json_response(shape.whole(results))

    def _tools(self, req: OpenAIRequest) -> None:
        """The chat's tool plan: its messages and tools for the template, its grammar."""
        assert req.chat is not None
        tok = self.core.tok
        parser = self.core.cfg.tool_call_parser
        plan = plan_tools(req.chat, tok.tool_call_parser() if parser == "auto" else parser)
        req.tools = plan
        for inp in req.inputs:
            inp.messages, inp.tools = prepare_messages(inp.messages or [], plan, tok.renders_tools)
            if plan.constrained:
                inp.sampling.json_schema = json.dumps(plan.schema())

    def _model(self, model: str | None) -> str:
        if model is None or model in self.names:
            return model or self.names[0]
        raise HttpError(
            404,
            f"the model '{model}' does not exist; this server serves {', '.join(self.names)}",
            "invalid_request_error",
            param="model",
            code="model_not_found",
        )

    async def _inputs(self, req: OpenAIRequest) -> tuple[list[GenerateInput], int | None]:
        """The generations to run, choices of one prompt adjacent; with n > 1 the prompt is
        prefilled once first (its cached tokens before that are returned)."""
        if req.n == 1:
            for inp in req.inputs:
                await self.core.tokenize_in_place(inp)  # validate every prompt before starting any
            return req.inputs, None
        out: list[GenerateInput] = []
        cached = 0
        for inp in req.inputs:
            ids, hit = await prefill_once(self.core, inp)
            cached += hit
            out.extend(choice_inputs(inp, ids, req.n))
        return out, cached


def _called(finish_reason: str) -> str:
    """A reply that called tools ends with `tool_calls` (unless it was cut or aborted)."""
    return "tool_calls" if finish_reason == "stop" else finish_reason


class Shape:
    """OpenAI's response objects for one request."""

    def __init__(
        self,
        core: FrontDoor,
        req: OpenAIRequest,
        model: str,
        chat: bool,
        cached: int | None,
        rid: str,
    ) -> None:
        self.core = core
        self.req = req
        self.model = model
        self.chat = chat
        self.cached = cached  # prompt cache hit before the prefill of n > 1
        self.id = ("chatcmpl-" if chat else "cmpl-") + rid  # the request id of the logs
        self.created = int(time.time())
        self.object = "chat.completion" if chat else "text_completion"

    def _tok(self, tid: int) -> str:
        return self.core.tok.decode([tid])

    def _head(self, obj: str) -> dict[str, Any]:
        return {"id": self.id, "object": obj, "created": self.created, "model": self.model}

    def usage(self, results: list[Complete]) -> dict[str, Any]:
        n = self.req.n
        # Each prompt counts once for its n choices, as OpenAI bills it.
        prompt = sum(r.prompt_tokens for r in results[::n])
        completion = sum(r.completion_tokens for r in results)
        cached = self.cached if self.cached is not None else sum(r.cached_tokens for r in results)
        return {
            "prompt_tokens": prompt,
            "completion_tokens": completion,
            "total_tokens": prompt + completion,
            "prompt_tokens_details": {"cached_tokens": cached},
        }

    def whole(self, results: list[Complete]) -> dict[str, Any]:
        out = self._head(self.object)
        out["choices"] = [self._choice(i, r) for i, r in enumerate(results)]
        out["usage"] = self.usage(results)
        return out

    def _choice(self, i: int, r: Complete) -> dict[str, Any]:
        if self.chat:
            message: dict[str, Any] = {"role": "assistant", "content": r.text}
            finish = r.finish_reason
            plan = self.req.tools
            if plan is not None and plan.active:
                content, calls = reply_calls(plan, r.text)
                if calls:
                    message = {
                        "role": "assistant",
                        "content": content or None,
                        "tool_calls": [c.as_dict() for c in calls],
                    }
                    finish = _called(finish)
            return {
                "index": i,
                "message": message,
                "logprobs": self._chat_lps(r.output_logprobs) if self.req.logprobs else None,
                "finish_reason": finish,
                "matched_stop": r.matched_stop or None,
            }
        text = r.text
        lps = None
        if self.req.echo:
            prompt_text = self.core.tok.decode(r.prompt_ids)
            text = prompt_text + text
        if self.req.logprobs and self.req.echo:
            lps = self._completion_lps(r.prompt_logprobs + r.output_logprobs, r.prompt_ids[:1])
        elif self.req.logprobs:
            lps = self._completion_lps(r.output_logprobs)
        return {
            "index": i,
            "text": text,
            "logprobs": lps,
            "finish_reason": r.finish_reason,
            "matched_stop": r.matched_stop or None,
        }

    def _chat_lps(self, lps: list[TokenLogprob]) -> dict[str, Any]:
        def entry(tid: int, lp: float) -> dict[str, Any]:
            t = self._tok(tid)
            return {"token": t, "logprob": lp, "bytes": list(t.encode())}

        content = []
        for lp in lps:
            e = entry(lp.token_id, lp.logprob)
            e["top_logprobs"] = [entry(t, v) for t, v in lp.top[: self.req.top_logprobs]]
            content.append(e)
        return {"content": content}

    def _completion_lps(
        self, lps: list[TokenLogprob], lead: list[int] | None = None
    ) -> dict[str, Any]:
        """Completions' logprobs object; `lead` are tokens without a logprob (the first
        prompt token, when echoing)."""
        tokens = [self._tok(t) for t in lead or []]
        values: list[float | None] = [None] * len(tokens)
        tops: list[dict[str, float] | None] = [None] * len(tokens)
        for lp in lps:
            tokens.append(self._tok(lp.token_id))
            values.append(lp.logprob)
            top = lp.top[: self.req.top_logprobs]
            tops.append({self._tok(t): v for t, v in top} if self.req.top_logprobs else None)
        offsets, pos = [], 0
        for t in tokens:
            offsets.append(pos)
            pos += len(t)
        return {
            "tokens": tokens,
            "token_logprobs": values,
            "top_logprobs": tops,
            "text_offset": offsets,
        }

    def chunk(
        self,
        i: int,
        ev: Chunk | None = None,
        role: bool = False,
        finish: Complete | None = None,
        text: str = "",
        called: bool = False,
    ) -> dict[str, Any]:
        out = self._head("chat.completion.chunk" if self.chat else "text_completion")
        choice: dict[str, Any] = {"index": i, "logprobs": None, "finish_reason": None}
        if finish is not None:
            choice["finish_reason"] = (
                _called(finish.finish_reason) if called else finish.finish_reason
            )
            choice["matched_stop"] = finish.matched_stop or None
        if self.chat:
            delta: dict[str, Any] = {}
            if role:
                delta = {"role": "assistant", "content": ""}
            elif ev is not None:
                delta = {"content": ev.text}
            choice["delta"] = delta
            if ev is not None and self.req.logprobs:
                choice["logprobs"] = self._chat_lps(ev.logprobs)
        else:
            choice["text"] = ev.text if ev is not None else text
            if ev is not None and self.req.logprobs:
                choice["logprobs"] = self._completion_lps(ev.logprobs)
        out["choices"] = [choice]
        if self.req.include_usage:
            out["usage"] = None
        return out

    def text_frames(self, n: int) -> TextFrames:
        """The frames of text-only events, byte-identical to `chunk(i, ev)` of such events
        when logprobs are off."""
        head = self._head("chat.completion.chunk" if self.chat else "text_completion")
        return TextFrames(head, self.chat, self.req.include_usage, n)

    def tool_streams(self, n: int) -> list[StreamedCalls] | None:
        """One tool-call reader per choice when the request's tools are on, else None."""
        plan = self.req.tools
        if plan is None or not plan.active:
            return None
        return [StreamedCalls(plan) for _ in range(n)]

    def delta_chunk(self, i: int, delta: dict[str, Any]) -> dict[str, Any]:
        out = self._head("chat.completion.chunk")
        out["choices"] = [{"index": i, "delta": delta, "logprobs": None, "finish_reason": None}]
        if self.req.include_usage:
            out["usage"] = None
        return out

    def usage_chunk(self, results: list[Complete]) -> dict[str, Any]:
        out = self._head("chat.completion.chunk" if self.chat else "text_completion")
        out["choices"] = []
        out["usage"] = self.usage(results)
        return out
