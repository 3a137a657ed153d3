"""gRPC client for RadixMesh, sync (`Client`) and asyncio (`AsyncClient`).

Needs only grpcio and protobuf. Errors surface as `RadixMeshError` carrying the gRPC status
code and the server's message. Generate calls retry a stream broken with UNAVAILABLE as a
continuation of what was received (`radixmesh.retry`); pass `retry=NO_RETRY` (to the client or
to one call) to opt out.

    from radixmesh import Client
    c = Client("localhost:50051")
    print(c.generate("The capital of France is", max_new_tokens=8).text)
"""

from __future__ import annotations

import asyncio
import json
import os
import time
from collections.abc import AsyncIterator, Callable, Generator, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import grpc

from radixmesh.retry import Resumable, RetryPolicy
from radixmesh.transport import open_aio_channel, open_channel
from radixmesh.wrong_port import (
    internal_tls_message,
    served_services,
    tls_internal_role,
    wrong_service_message,
)
from radixmesh_wire.pb import api_pb2, api_pb2_grpc

DEFAULT_ENDPOINT = os.environ.get("RADIXMESH_ENDPOINT", "localhost:50051")
_OPTIONS = [
    ("grpc.max_send_message_length", 64 << 20),
    ("grpc.max_receive_message_length", 64 << 20),
    # A restarted front door is back in seconds: reconnect that fast (gRPC's default backoff
    # grows to 120 s).
    ("grpc.initial_reconnect_backoff_ms", 100),
    ("grpc.min_reconnect_backoff_ms", 100),
    ("grpc.max_reconnect_backoff_ms", 1000),
]
_FINISH = {
    api_pb2.FINISH_REASON_STOP: "stop",
    api_pb2.FINISH_REASON_LENGTH: "length",
    api_pb2.FINISH_REASON_ABORT: "abort",
}


class RadixMeshError(Exception):
    def __init__(self, code: grpc.StatusCode, message: str) -> None:
        super().__init__(f"{code.name}: {message}")
        self.code = code
        self.message = message


@dataclass
class TokenLogprob:
    token_id: int
    logprob: float
    top: list[tuple[int, float]] = field(default_factory=list)


@dataclass
class GenerateResult:
    request_id: str
    text: str
    output_ids: list[int]
    finish_reason: str  # "stop", "length" or "abort"
    matched_stop: str
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int
    output_logprobs: list[TokenLogprob]
    prompt_logprobs: list[TokenLogprob]
    prompt_logprobs_from: int


@dataclass
class Chunk:
    text: str
    token_ids: list[int]
    rollback: int = 0  # drop this many ids of earlier chunks first (jump-forward)


def _lps(items: Any) -> list[TokenLogprob]:
    return [
        TokenLogprob(x.token_id, x.logprob, [(t.token_id, t.logprob) for t in x.top]) for x in items
    ]


def result_from_proto(rid: str, c: api_pb2.GenerateComplete) -> GenerateResult:
    return GenerateResult(
        request_id=rid,
        text=c.text,
        output_ids=list(c.output_ids),
        finish_reason=_FINISH.get(c.finish_reason, "unknown"),
        matched_stop=c.matched_stop,
        prompt_tokens=c.prompt_tokens,
        completion_tokens=c.completion_tokens,
        cached_tokens=c.cached_tokens,
        output_logprobs=_lps(c.output_logprobs),
        prompt_logprobs=_lps(c.prompt_logprobs),
        prompt_logprobs_from=c.prompt_logprobs_from,
    )


def build_request(
    prompt: str | None = None,
    *,
    input_ids: Sequence[int] | None = None,
    messages: Sequence[dict[str, str]] | None = None,
    request_id: str = "",
    max_new_tokens: int | None = None,
    min_new_tokens: int | None = None,
    temperature: float | None = None,
    top_p: float | None = None,
    top_k: int | None = None,
    min_p: float | None = None,
    presence_penalty: float | None = None,
    frequency_penalty: float | None = None,
    repetition_penalty: float | None = None,
    logit_bias: dict[int, float] | None = None,
    seed: int | None = None,
    stop: Sequence[str] = (),
    stop_token_ids: Sequence[int] = (),
    ignore_eos: bool = False,
    skip_special_tokens: bool = False,
    json_schema: str | Mapping[str, Any] | None = None,
    regex: str | None = None,
    ebnf: str | None = None,
    return_logprob: bool = False,
    top_logprobs: int = 0,
    prompt_logprobs_from: int | None = None,
    stream: bool = False,
    stream_interval: int | None = None,
    cache_salt: str = "",
    images: Sequence[bytes] = (),
) -> api_pb2.GenerateRequest:
    """Exactly one of prompt (raw text), input_ids or messages (chat) must be given, and at most
    one grammar (json_schema as a dict or its JSON text, regex, ebnf). `cache_salt` keeps this
    request's prefix cache apart from other requests of the same tenant that use another salt.
    `images` (encoded PNG/JPEG/... bytes; multimodal models) fill the prompt's image markers
    (the model's image token, e.g. "<image>") in order."""
    given = [x is not None for x in (prompt, input_ids, messages)]
    if sum(given) != 1:
        raise ValueError("give exactly one of prompt, input_ids or messages")
    named = (("json_schema", json_schema), ("regex", regex), ("ebnf", ebnf))
    grammars = [n for n, v in named if v is not None]
    if len(grammars) > 1:
        # The wire holds one constraint (a oneof): a second would silently replace the first.
        raise ValueError(
            f"give at most one of json_schema, regex or ebnf (got {' and '.join(grammars)})"
        )
    if json_schema is not None and not isinstance(json_schema, str):
        json_schema = json.dumps(json_schema)
    req = api_pb2.GenerateRequest(request_id=request_id, stream=stream, cache_salt=cache_salt)
    req.images.extend(images)
    if prompt is not None:
        req.text = prompt
    elif input_ids is not None:
        req.input_ids.ids.extend(input_ids)
    else:
        assert messages is not None
        req.chat.messages.extend(
            api_pb2.ChatMessage(role=m["role"], content=m["content"]) for m in messages
        )
    s = req.sampling
    for name, value in (
        ("max_new_tokens", max_new_tokens),
        ("min_new_tokens", min_new_tokens),
        ("temperature", temperature),
        ("top_p", top_p),
        ("top_k", top_k),
        ("min_p", min_p),
        ("presence_penalty", presence_penalty),
        ("frequency_penalty", frequency_penalty),
        ("repetition_penalty", repetition_penalty),
        ("seed", seed),
        ("json_schema", json_schema),
        ("regex", regex),
        ("ebnf", ebnf),
    ):
        if value is not None:
            setattr(s, name, value)
    s.stop.extend(stop)
    s.stop_token_ids.extend(stop_token_ids)
    s.logit_bias.update(logit_bias or {})
    s.ignore_eos = ignore_eos
    s.skip_special_tokens = skip_special_tokens
    req.logprobs.return_logprob = return_logprob
    req.logprobs.top_logprobs = top_logprobs
    if prompt_logprobs_from is not None:
        req.logprobs.prompt_logprobs_from = prompt_logprobs_from
    if stream_interval is not None:
        req.stream_interval = stream_interval
    return req


def _take(call: Resumable, msg: api_pb2.GenerateResponse) -> Chunk | GenerateResult:
    """One message of a Generate stream as what the caller sees (a chunk is also recorded,
    so a retry resumes after it)."""
    if msg.WhichOneof("response") == "chunk":
        call.on_chunk(msg.chunk)
        return Chunk(msg.chunk.text, list(msg.chunk.token_ids), msg.chunk.rollback)
    return result_from_proto(msg.request_id, msg.complete)


def _cut_short(call: Resumable) -> float:
    """The stream closed without its final message (the front door went away): the delay
    before resuming it, or RadixMeshError when the retry policy is spent."""
    delay = call.retry_after(grpc.StatusCode.UNAVAILABLE)
    if delay is None:
        raise RadixMeshError(grpc.StatusCode.UNAVAILABLE, "the stream ended without a result")
    return delay


def _error(exc: grpc.RpcError, endpoint: str, chan: grpc.Channel) -> RadixMeshError:
    code: grpc.StatusCode = exc.code()  # type: ignore[attr-defined]
    details: str = exc.details() or ""  # type: ignore[attr-defined]
    hint = None
    if code == grpc.StatusCode.UNIMPLEMENTED:
        hint = wrong_service_message(endpoint, served_services(chan))
    elif code == grpc.StatusCode.UNAVAILABLE:
        role = tls_internal_role(endpoint)
        hint = internal_tls_message(endpoint, role) if role else None
    if hint is not None:
        return RadixMeshError(code, f"{details} ({hint})" if details else hint)
    return RadixMeshError(code, details)


async def _aerror(
    exc: grpc.RpcError, endpoint: str, open_sync: Callable[[], grpc.Channel]
) -> RadixMeshError:
    # The wrong-port probe is a blocking call on a sync channel with the same credentials:
    # keep it off the event loop.
    def probe() -> RadixMeshError:
        chan = open_sync()
        try:
            return _error(exc, endpoint, chan)
        finally:
            chan.close()

    return await asyncio.to_thread(probe)


class _Connection:
    """What both clients hold and how they are built: the endpoint, the default timeout, the
    retry policy, the channel (each client opens its own kind: `_open_channel`), its stub, and
    a way to open a blocking channel with the caller's credentials."""

    channel: Any

    def __init__(
        self,
        endpoint: str = DEFAULT_ENDPOINT,
        timeout: float | None = None,
        api_key: str | None = None,
        tls: bool | str | None = None,
        retry: RetryPolicy | None = None,
    ) -> None:
        """`api_key` (default $RADIXMESH_API_KEY) goes with every call; `tls`: False, True
        (system roots) or a CA bundle path (default $RADIXMESH_TLS_CA, else plaintext);
        `retry`: how a broken stream is resumed (default RetryPolicy(); NO_RETRY: never)."""
        self.endpoint = endpoint
        self.timeout = timeout
        self.retry = retry if retry is not None else RetryPolicy()
        self._credentials: dict[str, Any] = {"api_key": api_key, "tls": tls}
        self.channel = self._open_channel()
        self.stub = api_pb2_grpc.RadixMeshStub(self.channel)

    def _open_channel(self) -> Any:
        raise NotImplementedError

    def _open_sync(self) -> grpc.Channel:
        return open_channel(self.endpoint, _OPTIONS, **self._credentials)


class Client(_Connection):
    """Blocking client. Thread-safe: one channel, calls from any thread."""

    channel: grpc.Channel

    def _open_channel(self) -> grpc.Channel:
        return self._open_sync()

    def close(self) -> None:
        self.channel.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def generate(
        self, prompt: str | None = None, *, retry: RetryPolicy | None = None, **kw: Any
    ) -> GenerateResult:
        for item in self._generate(build_request(prompt, **kw), retry):
            if isinstance(item, GenerateResult):
                return item
        raise RadixMeshError(grpc.StatusCode.INTERNAL, "stream ended without a result")

    def stream(
        self, prompt: str | None = None, *, retry: RetryPolicy | None = None, **kw: Any
    ) -> Generator[Chunk | GenerateResult, None, None]:
        """Yields Chunks as text arrives, then the final GenerateResult."""
        yield from self._generate(build_request(prompt, stream=True, **kw), retry)

    def _generate(
        self, req: api_pb2.GenerateRequest, retry: RetryPolicy | None
    ) -> Iterator[Chunk | GenerateResult]:
        call = Resumable(req, retry or self.retry, self.timeout)
        while True:
            attempt, timeout = call.next_request()
            try:
                for msg in self.stub.Generate(attempt, timeout=timeout):
                    out = _take(call, msg)
                    yield out
                    if isinstance(out, GenerateResult):
                        return
                delay = _cut_short(call)
            except grpc.RpcError as exc:
                again = call.retry_after(exc.code(), exc.details() or "")  # type: ignore[attr-defined]
                if again is None:
                    raise _error(exc, self.endpoint, self.channel) from None
                delay = again
            time.sleep(delay)

    def tokenize(
        self,
        text: str = "",
        messages: Sequence[dict[str, str]] | None = None,
        add_special_tokens: bool = False,
    ) -> list[int]:
        req = api_pb2.TokenizeRequest(add_special_tokens=add_special_tokens)
        if messages is not None:
            req.chat.messages.extend(api_pb2.ChatMessage(**m) for m in messages)
        else:
            req.text = text
        try:
            return list(self.stub.Tokenize(req, timeout=self.timeout).ids)
        except grpc.RpcError as exc:
            raise _error(exc, self.endpoint, self.channel) from None

    def detokenize(self, ids: Sequence[int], skip_special_tokens: bool = False) -> str:
        try:
            return self.stub.Detokenize(
                api_pb2.DetokenizeRequest(ids=ids, skip_special_tokens=skip_special_tokens),
                timeout=self.timeout,
            ).text
        except grpc.RpcError as exc:
            raise _error(exc, self.endpoint, self.channel) from None

    def model_info(self) -> api_pb2.ModelInfo:
        try:
            return self.stub.GetModelInfo(api_pb2.GetModelInfoRequest(), timeout=self.timeout)
        except grpc.RpcError as exc:
            raise _error(exc, self.endpoint, self.channel) from None

    def stats(self) -> api_pb2.Stats:
        try:
            return self.stub.GetStats(api_pb2.GetStatsRequest(), timeout=self.timeout)
        except grpc.RpcError as exc:
            raise _error(exc, self.endpoint, self.channel) from None

    def abort(self, request_id: str, timeout: float | None = None) -> bool:
        try:
            return self.stub.Abort(
                api_pb2.AbortRequest(request_id=request_id), timeout=timeout or self.timeout
            ).found
        except grpc.RpcError as exc:
            raise _error(exc, self.endpoint, self.channel) from None


class AsyncClient(_Connection):
    """asyncio client; create it inside a running event loop."""

    channel: grpc.aio.Channel

    def _open_channel(self) -> grpc.aio.Channel:
        return open_aio_channel(self.endpoint, _OPTIONS, **self._credentials)

    async def close(self) -> None:
        await self.channel.close()

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def generate(self, prompt: str | None = None, **kw: Any) -> GenerateResult:
        async for item in self.stream(prompt, _stream=False, **kw):
            if isinstance(item, GenerateResult):
                return item
        raise RadixMeshError(grpc.StatusCode.INTERNAL, "stream ended without a result")

    async def stream(
        self,
        prompt: str | None = None,
        _stream: bool = True,
        *,
        retry: RetryPolicy | None = None,
        **kw: Any,
    ) -> AsyncIterator[Chunk | GenerateResult]:
        call = Resumable(
            build_request(prompt, stream=_stream, **kw), retry or self.retry, self.timeout
        )
        while True:
            attempt, timeout = call.next_request()
            try:
                async for msg in self.stub.Generate(attempt, timeout=timeout):
                    out = _take(call, msg)
                    yield out
                    if isinstance(out, GenerateResult):
                        return
                delay = _cut_short(call)
            except grpc.RpcError as exc:
                again = call.retry_after(exc.code(), exc.details() or "")  # type: ignore[attr-defined]
                if again is None:
                    raise await _aerror(exc, self.endpoint, self._open_sync) from None
                delay = again
            await asyncio.sleep(delay)

    async def tokenize(self, text: str, add_special_tokens: bool = False) -> list[int]:
        try:
            resp = await self.stub.Tokenize(
                api_pb2.TokenizeRequest(text=text, add_special_tokens=add_special_tokens),
                timeout=self.timeout,
            )
        except grpc.RpcError as exc:
            raise await _aerror(exc, self.endpoint, self._open_sync) from None
        return list(resp.ids)

    async def model_info(self) -> api_pb2.ModelInfo:
        try:
            return await self.stub.GetModelInfo(api_pb2.GetModelInfoRequest(), timeout=self.timeout)
        except grpc.RpcError as exc:
            raise await _aerror(exc, self.endpoint, self._open_sync) from None

    async def stats(self) -> api_pb2.Stats:
        try:
            return await self.stub.GetStats(api_pb2.GetStatsRequest(), timeout=self.timeout)
        except grpc.RpcError as exc:
            raise await _aerror(exc, self.endpoint, self._open_sync) from None
