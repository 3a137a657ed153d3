"""`GrpcBackend`: the DSL backend over RadixMesh's public gRPC API (`radixmesh_wire.pb`).

Each call is one independent RPC on a shared, thread-safe channel. Every `Completion`
carries the server's accounting (`prompt_tokens`, `cached_tokens`), which the interpreter
sums per program (`ProgramState.stats`) to report cache hit rates.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Any

import grpc

from radixmesh.lang.backend import (
    BackendBase,
    Completion,
    LogprobRequest,
    ModelInfo,
    Prompt,
    RoleMarkers,
    TextCallback,
    TokenLogprob,
)
from radixmesh.lang.config import default_endpoint
from radixmesh.lang.errors import BackendError
from radixmesh.lang.images import split_images
from radixmesh.lang.params import GenParams
from radixmesh_wire.pb import api_pb2, api_pb2_grpc

_FINISH = {
    api_pb2.FINISH_REASON_STOP: "stop",
    api_pb2.FINISH_REASON_LENGTH: "length",
    api_pb2.FINISH_REASON_ABORT: "abort",
}


def sampling_message(params: GenParams) -> api_pb2.SamplingParams:
    """Only fields that are set go on the wire: unset means "server default"."""
    msg = api_pb2.SamplingParams(
        ignore_eos=bool(params.ignore_eos),
        stop=list(params.stop),
        stop_token_ids=list(params.stop_token_ids),
    )
    for name in ("temperature", "top_p", "top_k", "min_p", "seed", "max_new_tokens"):
        value = getattr(params, name)
        if value is not None:
            setattr(msg, name, value)
    if params.min_new_tokens is not None:
        msg.min_new_tokens = params.min_new_tokens
    if params.regex is not None:
        msg.regex = params.regex
    elif params.json_schema is not None:
        msg.json_schema = params.json_schema
    elif params.ebnf is not None:
        msg.ebnf = params.ebnf
    return msg


def generate_request(
    prompt: Prompt, params: GenParams, logprobs: LogprobRequest | None, *, stream: bool
) -> api_pb2.GenerateRequest:
    request = api_pb2.GenerateRequest(sampling=sampling_message(params), stream=stream)
    if isinstance(prompt, str):
        request.text, images = split_images(prompt)  # rm.image tags -> markers + bytes
        request.images.extend(images)
    else:
        request.input_ids.ids.extend(prompt)
    if logprobs is not None:
        request.logprobs.return_logprob = logprobs.return_logprob
        request.logprobs.top_logprobs = logprobs.top_logprobs
        if logprobs.prompt_logprobs_from is not None:
            request.logprobs.prompt_logprobs_from = logprobs.prompt_logprobs_from
    return request


def _logprobs(entries: Sequence[Any]) -> tuple[TokenLogprob, ...]:
    return tuple(
        TokenLogprob(e.token_id, e.logprob, tuple((t.token_id, t.logprob) for t in e.top))
        for e in entries
    )


def completion_from(request_id: str, msg: api_pb2.GenerateComplete) -> Completion:
    return Completion(
        text=msg.text,
        output_ids=tuple(msg.output_ids),
        finish_reason=_FINISH.get(msg.finish_reason, ""),
        matched_stop=msg.matched_stop,
        prompt_tokens=msg.prompt_tokens,
        completion_tokens=msg.completion_tokens,
        cached_tokens=msg.cached_tokens,
        output_logprobs=_logprobs(msg.output_logprobs),
        prompt_logprobs=_logprobs(msg.prompt_logprobs),
        prompt_logprobs_from=msg.prompt_logprobs_from,
        request_id=request_id,
    )


def model_info_from(msg: api_pb2.ModelInfo) -> ModelInfo:
    return ModelInfo(
        model_name=msg.model_name,
        roles={role: RoleMarkers(m.prefix, m.suffix) for role, m in msg.roles.items()},
        default_system_prompt=msg.default_system_prompt,
        generation_prefix=msg.generation_prefix,
        eos_token_ids=tuple(msg.eos_token_ids),
        bos_token_id=msg.bos_token_id if msg.bos_token_id >= 0 else None,
        context_length=msg.context_length,
        vocab_size=msg.vocab_size,
    )


def _rpc_error(what: str, exc: grpc.RpcError) -> BackendError:
    code = exc.code() if hasattr(exc, "code") else None
    details = exc.details() if hasattr(exc, "details") else str(exc)
    name = code.name if code is not None else None
    return BackendError(f"{what} failed: {name}: {details}", code=name)


class GrpcBackend(BackendBase):
    """Talks to a RadixMesh front door (`radixmesh serve` prints its address).

    `timeout` (seconds) bounds every RPC; None waits indefinitely.
    """

    def __init__(
        self,
        endpoint: str | None = None,
        *,
        timeout: float | None = None,
        channel: grpc.Channel | None = None,
    ) -> None:
        self.endpoint = endpoint or default_endpoint()
        self.timeout = timeout
        self._owns_channel = channel is None
        self._channel = channel or grpc.insecure_channel(
            self.endpoint,
            options=[
                ("grpc.max_receive_message_length", 64 << 20),
                ("grpc.max_send_message_length", 64 << 20),
            ],
        )
        self._stub: Any = api_pb2_grpc.RadixMeshStub(self._channel)  # type: ignore[no-untyped-call]
        self._info: ModelInfo | None = None
        self._lock = threading.Lock()

    def generate(
        self,
        prompt: Prompt,
        params: GenParams,
        *,
        logprobs: LogprobRequest | None = None,
        on_text: TextCallback | None = None,
    ) -> Completion:
        request = generate_request(prompt, params, logprobs, stream=on_text is not None)
        completion: Completion | None = None
        try:
            # Drain the stream even after `complete` (the last message) so the call ends
            # normally instead of being cancelled by garbage collection.
            for response in self._stub.Generate(request, timeout=self.timeout):
                kind = response.WhichOneof("response")
                if kind == "chunk" and on_text is not None and response.chunk.text:
                    on_text(response.chunk.text)
                elif kind == "complete":
                    completion = completion_from(response.request_id, response.complete)
        except grpc.RpcError as exc:
            raise _rpc_error("Generate", exc) from exc
        if completion is None:
            raise BackendError("Generate stream ended without a complete message")
        return completion

    def tokenize(self, text: str, *, add_special_tokens: bool = True) -> list[int]:
        request = api_pb2.TokenizeRequest(text=text, add_special_tokens=add_special_tokens)
        try:
            return list(self._stub.Tokenize(request, timeout=self.timeout).ids)
        except grpc.RpcError as exc:
            raise _rpc_error("Tokenize", exc) from exc

    def detokenize(self, ids: Sequence[int]) -> str:
        """Text of token ids (used for `gen(return_text_in_logprobs=True)`)."""
        request = api_pb2.DetokenizeRequest(ids=list(ids))
        try:
            return str(self._stub.Detokenize(request, timeout=self.timeout).text)
        except grpc.RpcError as exc:
            raise _rpc_error("Detokenize", exc) from exc

    def model_info(self) -> ModelInfo:
        with self._lock:
            if self._info is None:
                try:
                    msg = self._stub.GetModelInfo(
                        api_pb2.GetModelInfoRequest(), timeout=self.timeout
                    )
                except grpc.RpcError as exc:
                    raise _rpc_error("GetModelInfo", exc) from exc
                self._info = model_info_from(msg)
            return self._info

    def server_stats(self) -> api_pb2.Stats:
        """The server's counters (cache hit rate, queue, KV usage) via GetStats."""
        try:
            stats: api_pb2.Stats = self._stub.GetStats(
                api_pb2.GetStatsRequest(), timeout=self.timeout
            )
            return stats
        except grpc.RpcError as exc:
            raise _rpc_error("GetStats", exc) from exc

    def close(self) -> None:
        if self._owns_channel:
            self._channel.close()

    def __repr__(self) -> str:
        return f"GrpcBackend({self.endpoint!r})"


def RuntimeEndpoint(endpoint: str | None = None, *, timeout: float | None = None) -> GrpcBackend:  # noqa: N802 - SGLang's spelling
    """SGLang-style constructor: `rm.set_default_backend(rm.RuntimeEndpoint("host:port"))`."""
    return GrpcBackend(endpoint, timeout=timeout)
