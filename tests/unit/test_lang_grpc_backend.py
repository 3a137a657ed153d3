"""GrpcBackend against an in-process fake RadixMesh server: wire format and semantics."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from concurrent import futures
from typing import Any

import grpc
import pytest
import radixmesh as rm
from radixmesh.lang.backend import LogprobRequest
from radixmesh.lang.grpc_backend import generate_request
from radixmesh.lang.params import GenParams

from radixmesh_wire.pb import api_pb2, api_pb2_grpc


class FakeRadixMesh(api_pb2_grpc.RadixMeshServicer):
    """Words are tokens; every prompt logprob is -0.5 except " no" (-2.0)."""

    def __init__(self) -> None:
        self.requests: list[api_pb2.GenerateRequest] = []
        self.lock = threading.Lock()
        self.vocab: dict[str, int] = {}

    def ids(self, text: str) -> list[int]:
        with self.lock:
            return [self.vocab.setdefault(w, len(self.vocab) + 10) for w in text.split(" ")]

    def Generate(self, request: Any, context: Any) -> Iterator[api_pb2.GenerateResponse]:  # noqa: N802
        with self.lock:
            self.requests.append(request)
        if request.sampling.HasField("regex") and request.sampling.regex == "(":
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, "bad regex")
        ids = self.ids(request.text) if request.HasField("text") else list(request.input_ids.ids)
        words = ["a", " b", " c"]
        if request.sampling.HasField("max_new_tokens"):
            words = words[: request.sampling.max_new_tokens]
        if request.stream:
            for w in words:
                yield api_pb2.GenerateResponse(chunk=api_pb2.GenerateChunk(text=w))
        done = api_pb2.GenerateComplete(
            text="".join(words),
            finish_reason=api_pb2.FINISH_REASON_LENGTH,
            prompt_tokens=len(ids),
            completion_tokens=len(words),
            cached_tokens=1,
        )
        if request.logprobs.HasField("prompt_logprobs_from"):
            start = max(request.logprobs.prompt_logprobs_from, 1)
            done.prompt_logprobs_from = start
            inverse = {v: k for k, v in self.vocab.items()}
            for pos in range(start, len(ids)):
                entry = done.prompt_logprobs.add(token_id=ids[pos])
                entry.logprob = -2.0 if inverse.get(ids[pos]) == "no" else -0.5
                if request.logprobs.top_logprobs:
                    entry.top.add(token_id=ids[pos], logprob=entry.logprob)
        yield api_pb2.GenerateResponse(request_id="r1", complete=done)

    def Tokenize(self, request: Any, context: Any) -> api_pb2.TokenizeResponse:  # noqa: N802
        return api_pb2.TokenizeResponse(ids=self.ids(request.text))

    def GetModelInfo(self, request: Any, context: Any) -> api_pb2.ModelInfo:  # noqa: N802
        info = api_pb2.ModelInfo(model_name="fake", eos_token_ids=[2], bos_token_id=-1)
        info.roles["user"].prefix, info.roles["user"].suffix = "<u>", "</u>"
        info.roles["assistant"].prefix, info.roles["assistant"].suffix = "<a>", "</a>"
        info.roles["system"].prefix, info.roles["system"].suffix = "<s>", "</s>"
        return info


@pytest.fixture(scope="module")
def server() -> Iterator[tuple[FakeRadixMesh, str]]:
    fake = FakeRadixMesh()
    srv = grpc.server(futures.ThreadPoolExecutor(max_workers=8))
    api_pb2_grpc.add_RadixMeshServicer_to_server(fake, srv)
    port = srv.add_insecure_port("127.0.0.1:0")
    srv.start()
    yield fake, f"127.0.0.1:{port}"
    srv.stop(None)


def test_unset_sampling_fields_stay_off_the_wire() -> None:
    request = generate_request("hi", GenParams(), None, stream=False)
    sampling = request.sampling
    for name in ("temperature", "top_p", "top_k", "min_p", "seed", "max_new_tokens"):
        assert not sampling.HasField(name), name
    assert sampling.WhichOneof("constraint") is None and not request.HasField("logprobs")


def test_set_fields_and_prefix_only_requests() -> None:
    params = GenParams(max_new_tokens=0, temperature=0.0, stop=("END",), regex=r"\d+", seed=7)
    logprobs = LogprobRequest(prompt_logprobs_from=0, top_logprobs=1)
    request = generate_request([1, 2, 3], params, logprobs, stream=True)
    sampling = request.sampling
    assert sampling.HasField("max_new_tokens") and sampling.max_new_tokens == 0
    assert sampling.HasField("temperature") and sampling.temperature == 0.0
    assert sampling.WhichOneof("constraint") == "regex" and list(sampling.stop) == ["END"]
    assert request.WhichOneof("input") == "input_ids" and list(request.input_ids.ids) == [1, 2, 3]
    assert request.logprobs.HasField("prompt_logprobs_from")
    assert request.logprobs.prompt_logprobs_from == 0 and request.logprobs.top_logprobs == 1
    assert request.stream


def test_generate_streams_and_converts_the_completion(server: tuple[FakeRadixMesh, str]) -> None:
    _, endpoint = server
    backend = rm.RuntimeEndpoint(endpoint, timeout=10)
    chunks: list[str] = []
    done = backend.generate("x y", GenParams(max_new_tokens=2), on_text=chunks.append)
    assert chunks == ["a", " b"] and done.text == "a b"
    assert (done.finish_reason, done.prompt_tokens, done.cached_tokens) == ("length", 2, 1)
    assert done.request_id == "r1"
    backend.close()


def test_model_info_and_tokenize(server: tuple[FakeRadixMesh, str]) -> None:
    _, endpoint = server
    backend = rm.GrpcBackend(endpoint, timeout=10)
    info = backend.model_info()
    assert info.roles["user"] == rm.RoleMarkers("<u>", "</u>") and info.bos_token_id is None
    assert backend.tokenize("p q") == backend.tokenize("p q") and len(backend.tokenize("p q")) == 2


def test_rpc_errors_become_backend_errors_at_the_read(server: tuple[FakeRadixMesh, str]) -> None:
    _, endpoint = server

    @rm.function
    def prog(s: rm.ProgramState) -> None:
        s += "x" + rm.gen("v", regex="(")

    state = prog.run(backend=rm.GrpcBackend(endpoint, timeout=10))
    with pytest.raises(rm.ProgramError) as info:
        state["v"]
    cause = info.value.__cause__
    assert isinstance(cause, rm.BackendError) and cause.code == "INVALID_ARGUMENT"
    assert isinstance(cause.__cause__, grpc.RpcError)


def test_unreachable_server_is_unavailable() -> None:
    backend = rm.GrpcBackend("127.0.0.1:1", timeout=2)
    with pytest.raises(rm.BackendError) as info:
        backend.tokenize("x")
    assert info.value.code in ("UNAVAILABLE", "DEADLINE_EXCEEDED")


def test_program_over_grpc_sends_hints_and_scores(server: tuple[FakeRadixMesh, str]) -> None:
    fake, endpoint = server
    fake.requests.clear()

    @rm.function
    def prog(s: rm.ProgramState) -> None:
        s += rm.user("Is it ok?")
        s += rm.assistant(rm.select("ok", [" yes", " no"]))
        forks = s.fork(2)
        forks += rm.gen("g", max_tokens=3)

    state = prog.run(backend=rm.GrpcBackend(endpoint, timeout=10))
    assert state["ok"] == " yes"
    meta = state.get_meta_info("ok")
    assert isinstance(meta.source, rm.SelectResult) and meta.scores == (-0.5, -2.0)
    state.wait()
    warm = [
        r for r in fake.requests if r.sampling.max_new_tokens == 0 and not r.logprobs.ByteSize()
    ]
    scored = [r for r in fake.requests if r.logprobs.HasField("prompt_logprobs_from")]
    assert len(warm) == 2  # select's prefix hint and the fork hint
    assert len(scored) == 2 and all(r.sampling.HasField("max_new_tokens") for r in scored)
    assert state.cached_tokens == len(fake.requests)  # the fake reports 1 per request
