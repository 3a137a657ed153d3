"""SGLang-native endpoints: /generate, /get_model_info, /server_info (/get_server_info),
/flush_cache, /health_generate: what `sgl.RuntimeEndpoint` and `sglang.bench_serving
--backend sglang` call.

Differences from SGLang are in docs/http.md; the shapes follow what those clients read:
`text` (cumulative when streaming) and `meta_info` with token counts, a finish reason object
and logprob lists of [logprob, token_id, text-or-None].
"""

from __future__ import annotations

import json
import time
import uuid
from contextlib import aclosing
from json.encoder import encode_basestring  # type: ignore[attr-defined]
from typing import Any

from aiohttp import web

from radixmesh_wire.pb import api_pb2
from tokenizer_service.core import FrontDoor, GenerateError, GenerateInput
from tokenizer_service.events import Chunk, Complete, TokenLogprob
from tokenizer_service.http.errors import (
    REQUEST_ID,
    REQUEST_ID_RULE,
    TENANT,
    HttpError,
    error_response,
    from_status,
    read_json,
    valid_request_id,
)
from tokenizer_service.http.fanout import merged, name_inputs, run_all
from tokenizer_service.http.image_parts import image_bytes
from tokenizer_service.http.openai_params import sampling_params
from tokenizer_service.http.protocol import SGLangGenerate, SGLangSampling, validate
from tokenizer_service.http.sse import DONE, frame, open_stream
from tokenizer_service.routing.replica_stats import NoReplicaAnswered, flush_all, gather_stats


class SGLangApi:
    def __init__(
        self,
        core: FrontDoor,
        model_path: str,
        server_args: dict[str, Any],
    ) -> None:
        self.core = core
        self.model_path = model_path
        self.server_args = server_args

    def routes(self) -> list[web.RouteDef]:
        return [
            web.post("/generate", self.generate),
            web.get("/get_model_info", self.model_info),
            web.get("/model_info", self.model_info),  # SGLang >= 0.5's name (bench_serving)
            web.get("/server_info", self.server_info),
            web.get("/get_server_info", self.server_info),
            web.post("/flush_cache", self.flush_cache),
            web.get("/flush_cache", self.flush_cache),
            web.get("/health_generate", self.health_generate),
        ]

    async def model_info(self, request: web.Request) -> web.Response:
        return web.json_response(
            {
                "model_path": self.model_path,
                "tokenizer_path": self.model_path,
                "is_generation": True,
                "preferred_sampling_params": None,
                "context_length": self.core.context_length,
                "vocab_size": self.core.tok.vocab_size,
            }
        )

    async def server_info(self, request: web.Request) -> web.Response:
        try:
            stats = await gather_stats(self.core.replicas)
        except NoReplicaAnswered as exc:
            return error_response(HttpError(503, f"scheduler: {exc}", "unavailable"))
        # One internal state per replica that answered, as SGLang lists one per DP rank.
        states = [
            {
                "running_requests": s.running_requests,
                "queue_length": s.queue_length,
                "token_usage": s.token_usage,
                "cache_hit_rate": s.cache_hit_rate,
                "max_total_num_tokens": s.kv_capacity,
                "replica": r.address,
            }
            for r in stats.replicas
            if r.HasField("scheduler")
            for s in (r.scheduler,)
        ]
        return web.json_response(
            {
                **self.server_args,
                "context_length": self.core.context_length,
                "version": "radixmesh",
                "internal_states": states,
            }
        )

    async def flush_cache(self, request: web.Request) -> web.Response:
        try:
            res = await flush_all(self.core.replicas)
        except NoReplicaAnswered as exc:
            return error_response(HttpError(503, f"scheduler: {exc}", "unavailable"))
        if not res.flushed:
            return web.Response(status=400, text=f"Cache not flushed: {res.message}\n")
        return web.Response(text=f"Cache flushed ({res.evicted_tokens} tokens).\n")

    async def health_generate(self, request: web.Request) -> web.Response:
        """Ready and able to generate one token end to end."""
        if not self.core.ready:
            return web.Response(status=503, text="not ready: the scheduler is not connected\n")
        inp = GenerateInput(
            input_ids=[0],
            sampling=api_pb2.SamplingParams(max_new_tokens=1, temperature=0),
            tenant=request.get(TENANT, ""),
        )
        try:
            await self.core.run(inp)
        except GenerateError as exc:
            return web.Response(status=503, text=f"generation failed: {exc.message}\n")
        return web.Response(text="")

    async def generate(self, request: web.Request) -> web.StreamResponse:
        try:
            body = await read_json(request)
            req = _parse(body, self.core.context_length)
            for inp in req.inputs:
                inp.tenant = request.get(TENANT, "")
            _name(req, body.get("rid"), request.get(REQUEST_ID) or uuid.uuid4().hex)
            if not self.core.ready:
                raise HttpError(503, "not ready: the scheduler is not connected", "unavailable")
            for k, inp in enumerate(req.inputs):
                ids = await self.core.tokenize_in_place(inp)
                if req.start[k] == -1 and req.return_logprob:
                    # SGLang's -1: the last prompt token only
                    req.start[k] = len(ids) - 1
                    inp.logprobs.prompt_logprobs_from = len(ids) - 1
        except HttpError as err:
            return error_response(err)
        except GenerateError as exc:
            return error_response(from_status(exc.status, exc.message, exc.field))
        shape = _Meta(self.core, req)
        if req.stream:
            return await self._stream(request, req, shape)
        try:
            results = await run_all(self.core, req.inputs)
        except GenerateError as exc:
            return error_response(from_status(exc.status, exc.message, exc.field))
        out = [shape.result(i, r) for i, r in enumerate(results)]
        return web.json_response(out if req.batch else out[0])

    async def _stream(
        self, request: web.Request, req: _Request, shape: _Meta
    ) -> web.StreamResponse:
        resp = await open_stream(request)
        # The last result (or an error) leaves with [DONE] and the chunked EOF in one write:
        # one socket send instead of three at the end of every stream.
        tail = b""
        try:
            if len(req.inputs) == 1:  # the common case: straight from the core, no fan-out
                async with aclosing(self.core.generate(req.inputs[0])) as one:
                    async for ev in one:
                        if isinstance(ev, Chunk):
                            if shape.add(0, ev):
                                await resp.write(shape.partial_frame(0))
                        else:
                            tail = frame(shape.result(0, ev))
            else:
                tail = await self._fan_out(resp, req, shape)
        except GenerateError as exc:
            tail = frame(from_status(exc.status, exc.message, exc.field).body())
        await resp.write_eof(tail + DONE)
        return resp

    async def _fan_out(self, resp: web.StreamResponse, req: _Request, shape: _Meta) -> bytes:
        """A batch's events as they come; returns the frame of the last result."""
        left = len(req.inputs)
        async with aclosing(merged(self.core, req.inputs)) as events:
            async for i, ev in events:
                if isinstance(ev, Chunk):
                    if shape.add(i, ev):
                        await resp.write(shape.partial_frame(i))
                else:
                    left -= 1
                    end = frame(shape.result(i, ev))
                    if not left:
                        return end
                    await resp.write(end)
        return b""


class _Request:
    def __init__(self) -> None:
        self.inputs: list[GenerateInput] = []
        self.batch = False
        self.stream = False
        self.return_logprob = False
        self.text_in_logprobs = False
        self.top_n = 0
        self.start: list[int] = []  # logprob start per input (-1: none asked)


def _parse(d: dict[str, Any], context_length: int) -> _Request:
    b = validate(SGLangGenerate, d)
    req = _Request()
    if (b.text is None) == (b.input_ids is None):
        raise HttpError(400, "set exactly one of 'text' and 'input_ids'", param="text")
    prompts: list[str | list[int]]
    if isinstance(b.text, str):
        prompts = [b.text]
    elif b.text is not None:
        prompts, req.batch = list(b.text), True
    else:
        ids = b.input_ids or []
        if ids and all(isinstance(i, int) for i in ids):
            prompts = [[i for i in ids if isinstance(i, int)]]
        else:
            prompts, req.batch = [list(i) for i in ids if isinstance(i, list)], True
    if not prompts:
        param = "text" if b.text is not None else "input_ids"
        raise HttpError(422, f"'{param}' is empty: send at least one prompt", param=param)
    sp = b.sampling_params or SGLangSampling()
    sampling = sampling_params(sp)
    if sp.skip_special_tokens is None:
        sampling.skip_special_tokens = True
    req.stream = bool(b.stream)
    req.return_logprob = bool(_first(b.return_logprob))
    req.text_in_logprobs = bool(b.return_text_in_logprobs)
    req.top_n = int(_first(b.top_logprobs_num) or 0)
    images = _images(b.image_data, len(prompts), req.batch)
    for k, p in enumerate(prompts):
        starts = b.logprob_start_len
        start = starts[k] if isinstance(starts, list) and k < len(starts) else _first(starts)
        start = -1 if start is None else int(start)
        lp = api_pb2.LogprobOptions(return_logprob=req.return_logprob, top_logprobs=req.top_n)
        if req.return_logprob and start >= 0:
            lp.prompt_logprobs_from = start
        req.start.append(start)
        inp = GenerateInput(sampling=sampling, logprobs=lp, stream=req.stream, images=images[k])
        if isinstance(p, str):
            inp.text = p
        else:
            inp.input_ids = p
        req.inputs.append(inp)
    return req


def _images(data: str | list[Any] | None, n: int, batch: bool) -> list[list[bytes]]:
    """Per prompt, the bytes of its `image_data` (data URLs or base64; SGLang's file paths
    and URLs are refused: the server reads no files and fetches nothing)."""
    if data is None:
        return [[] for _ in range(n)]
    if not batch:
        refs = [data] if isinstance(data, str) else list(data)
        if not all(isinstance(r, str) for r in refs):
            raise HttpError(
                422, "'image_data' of one prompt is a string or a list", param="image_data"
            )
        return [[image_bytes(r, f"image_data[{i}]", True) for i, r in enumerate(refs)]]
    if not isinstance(data, list) or len(data) != n:
        raise HttpError(
            400, f"'image_data' of a batch needs one entry per text ({n})", param="image_data"
        )
    out: list[list[bytes]] = []
    for k, item in enumerate(data):
        refs = [item] if isinstance(item, str) else list(item)
        out.append([image_bytes(r, f"image_data[{k}][{i}]", True) for i, r in enumerate(refs)])
    return out


def _first(v: Any) -> Any:
    """SGLang allows one value per prompt for some fields: the first one speaks for all."""
    return (v[0] if v else None) if isinstance(v, list) else v


def _name(req: _Request, rid: Any, header_rid: str) -> None:
    """SGLang's `rid` (a string, or one per prompt of a batch) names the generations; without
    it the HTTP request's id (X-Request-Id or a new one) does."""
    if rid is None:
        name_inputs(header_rid, req.inputs)
        return
    rids = rid if isinstance(rid, list) else [rid]
    if len(rids) != len(req.inputs) or not all(
        isinstance(r, str) and valid_request_id(r) for r in rids
    ):
        raise HttpError(
            400,
            f"'rid' must be one id per prompt ({len(req.inputs)} here), each {REQUEST_ID_RULE}",
            param="rid",
        )
    if len(set(rids)) != len(rids):
        raise HttpError(400, "'rid' repeats an id within the batch", param="rid")
    for inp, r in zip(req.inputs, rids, strict=True):
        inp.rid = r


class _Meta:
    """SGLang's response objects: cumulative text while streaming, then the final result."""

    def __init__(self, core: FrontDoor, req: _Request) -> None:
        self.core = core
        self.req = req
        self.t0 = time.perf_counter()
        self.rids = [inp.rid for inp in req.inputs]  # meta_info.id: the id in the logs
        self.rids_json = [json.dumps(r).encode() for r in self.rids]
        self.texts: list[list[str]] = [[] for _ in req.inputs]  # the text's pieces
        self.ids: list[list[int]] = [[] for _ in req.inputs]
        self.lps: list[list[TokenLogprob]] = [[] for _ in req.inputs]
        # The cumulative text and ids already JSON-encoded (without quotes / brackets) as
        # UTF-8, grown by each chunk: a streamed event then copies them once into its frame
        # instead of re-encoding the whole output per token (quadratic in the output length;
        # it cost HTTP ~10% of throughput against gRPC at 2,000 ShareGPT streams), and only
        # the new piece is escaped and encoded. JSON escaping is per character, so the escaped
        # pieces concatenate to the escaped whole.
        self.text_json = [bytearray() for _ in req.inputs]
        self.ids_json = [bytearray() for _ in req.inputs]

    def add(self, i: int, ev: Chunk) -> bool:
        """Take a chunk; True when it changes the response (text or ids: an event to send)."""
        if ev.text:
            self.texts[i].append(ev.text)
            self.text_json[i] += encode_basestring(ev.text)[1:-1].encode()
        ids = self.ids[i]
        if ev.rollback:  # a jump-forward retokenized ids sent before (text is unchanged)
            del ids[max(len(ids) - ev.rollback, 0) :]
            self.ids_json[i] = bytearray(",".join(map(str, ids)).encode())
        if ev.logprobs:
            self.lps[i].extend(ev.logprobs)
        if ev.token_ids:
            more = ",".join(map(str, ev.token_ids)).encode()
            ids_json = self.ids_json[i]
            ids_json += b"," + more if ids else more
            ids.extend(ev.token_ids)
        return bool(ev.text or ev.token_ids)

    def partial_frame(self, i: int) -> bytes:
        """The SSE frame of `partial(i)`, from the pre-encoded text and ids."""
        if self.req.return_logprob:
            return frame(self.partial(i))
        # json.dumps of partial(i), written out: the id is encoded once per request and a
        # float's JSON is its repr
        return b"".join(
            (
                b'data: {"text": "',
                self.text_json[i],
                b'", "output_ids": [',
                self.ids_json[i],
                b'], "meta_info": {"id": ',
                self.rids_json[i],
                b', "finish_reason": null, "completion_tokens": ',
                str(len(self.ids[i])).encode(),
                b', "e2e_latency": ',
                repr(time.perf_counter() - self.t0).encode(),
                b"}}\n\n",
            )
        )

    def _lp(self, tid: int, lp: float | None) -> list[Any]:
        text = self.core.tok.decode([tid]) if self.req.text_in_logprobs else None
        return [lp, tid, text]

    def _tops(self, lps: list[TokenLogprob]) -> list[Any]:
        return [[self._lp(t, v) for t, v in lp.top[: self.req.top_n]] for lp in lps]

    def partial(self, i: int) -> dict[str, Any]:
        meta: dict[str, Any] = {
            "id": self.rids[i],
            "finish_reason": None,
            "completion_tokens": len(self.ids[i]),
            "e2e_latency": time.perf_counter() - self.t0,
        }
        if self.req.return_logprob:
            meta["output_token_logprobs"] = [self._lp(x.token_id, x.logprob) for x in self.lps[i]]
        return {"text": "".join(self.texts[i]), "output_ids": self.ids[i], "meta_info": meta}

    def result(self, i: int, r: Complete) -> dict[str, Any]:
        finish: dict[str, Any] = {"type": r.finish_reason}
        if r.finish_reason == "length":
            finish["length"] = r.completion_tokens
        elif r.matched_stop:
            m = r.matched_stop
            finish["matched"] = int(m) if m.lstrip("-").isdigit() else m
        meta: dict[str, Any] = {
            "id": self.rids[i],
            "finish_reason": finish,
            "prompt_tokens": r.prompt_tokens,
            "completion_tokens": r.completion_tokens,
            "cached_tokens": r.cached_tokens,
            "e2e_latency": time.perf_counter() - self.t0,
        }
        if self.req.return_logprob:
            start = self.req.start[i]
            inp: list[Any] = []
            in_top: list[Any] = []
            if start >= 0:
                if (
                    start == 0 and r.prompt_ids
                ):  # nothing precedes the first token: SGLang reports None
                    inp.append(self._lp(r.prompt_ids[0], None))
                    in_top.append(None)
                inp.extend(self._lp(x.token_id, x.logprob) for x in r.prompt_logprobs)
                in_top.extend(self._tops(r.prompt_logprobs))
            meta["input_token_logprobs"] = inp
            meta["output_token_logprobs"] = [
                self._lp(x.token_id, x.logprob) for x in r.output_logprobs
            ]
            meta["input_top_logprobs"] = in_top
            meta["output_top_logprobs"] = self._tops(r.output_logprobs)
        return {"text": r.text, "output_ids": r.output_ids, "meta_info": meta}
