"""`rm.OpenAI` and API speculative execution against a small fake OpenAI-compatible server.

The fake (a real HTTP server on a free localhost port, inside this test) "wants" to write
DOCUMENT: it continues a prompt with the rest of DOCUMENT after the longest DOCUMENT prefix the
prompt ends with, then applies `stop` and `max_tokens` (tokens are whitespace-led words).
That makes outputs prompt-dependent and exact, so speculation can be checked to produce the
same values as plain execution while making fewer calls.
"""

from __future__ import annotations

import json
import re
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
import radixmesh as rm

from radixmesh_bench import dsl_spec

DOCUMENT = "Name: Ada Lovelace\nBirthday: December 10, 1815\nJob: Mathematician\nEnd.\n"
_TOKEN = re.compile(r"\s*\S+|\s+")


def _tokens(text: str) -> list[str]:
    return _TOKEN.findall(text)


def continuation(prompt: str) -> str:
    for k in range(len(DOCUMENT), 0, -1):
        if prompt.endswith(DOCUMENT[:k]):
            return DOCUMENT[k:]
    return DOCUMENT


class FakeOpenAI(BaseHTTPRequestHandler):
    requests: list[tuple[str, dict[str, Any]]] = []

    def log_message(self, *args: Any) -> None:  # keep test output quiet
        return None

    def do_POST(self) -> None:  # noqa: N802 - http.server's name
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        FakeOpenAI.requests.append((self.path, body))
        if body.get("model") == "broken":
            self._send(400, {"error": {"message": "model 'broken' does not exist"}})
            return
        if self.path == "/v1/completions":
            prompt = body["prompt"]
            text, finish = continuation(prompt), "stop"
        elif self.path == "/v1/chat/completions":
            prompt = json.dumps(body["messages"])
            reply = DOCUMENT if body["model"] == "fake-chat-doc" else "Hello from chat."
            text, finish = reply, "stop"
        else:
            self._send(404, {"error": {"message": "no such route"}})
            return
        stops = [(text.find(s), s) for s in body.get("stop") or [] if s in text]
        if stops:
            text = text[: min(stops)[0]]
        limit = body.get("max_tokens")
        if limit is not None and len(_tokens(text)) > limit:
            text, finish = "".join(_tokens(text)[:limit]), "length"
        usage = {
            "prompt_tokens": len(_tokens(prompt)),
            "completion_tokens": len(_tokens(text)),
            "prompt_tokens_details": {"cached_tokens": 0},
        }
        chat = self.path.startswith("/v1/chat")
        if body.get("stream"):
            self._stream(text, finish, usage, chat=chat)
            return
        choice: dict[str, Any] = {"index": 0, "finish_reason": finish}
        if chat:
            choice["message"] = {"role": "assistant", "content": text}
        else:
            choice["text"] = text
        self._send(200, {"id": "cmpl-1", "choices": [choice], "usage": usage})

    def _send(self, status: int, payload: dict[str, Any]) -> None:
        data = json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _stream(self, text: str, finish: str, usage: dict[str, Any], *, chat: bool) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.end_headers()
        for token in _tokens(text):
            piece = {"delta": {"content": token}} if chat else {"text": token}
            self._event({"choices": [{"index": 0, **piece, "finish_reason": None}]})
        self._event({"choices": [{"index": 0, "finish_reason": finish}]})
        self._event({"choices": [], "usage": usage})
        self.wfile.write(b"data: [DONE]\n\n")

    def _event(self, payload: dict[str, Any]) -> None:
        self.wfile.write(b"data: " + json.dumps(payload).encode() + b"\n\n")


@pytest.fixture(scope="module")
def base_url() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), FakeOpenAI)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}/v1"
    server.shutdown()
    server.server_close()


@pytest.fixture(autouse=True)
def clear_requests() -> None:
    FakeOpenAI.requests.clear()


def completion_backend(base_url: str) -> rm.OpenAIBackend:
    return rm.OpenAI("fake-instruct", base_url=base_url, api_key="k", is_chat_model=False)


def character(s: rm.ProgramState) -> None:
    s += "Fill in a character.\n"
    s += "Name:" + rm.gen("name", stop="\n") + "\nBirthday:" + rm.gen("birthday", stop="\n")
    s += "\nJob:" + rm.gen("job", stop="\n") + "\n"


EXPECTED = {"name": " Ada Lovelace", "birthday": " December 10, 1815", "job": " Mathematician"}


def test_completion_program_sends_sampling_knobs_and_counts_usage(base_url: str) -> None:
    state = rm.function(character).run(backend=completion_backend(base_url), temperature=0)
    assert {k: state[k] for k in EXPECTED} == EXPECTED
    assert [path for path, _ in FakeOpenAI.requests] == ["/v1/completions"] * 3
    first = FakeOpenAI.requests[0][1]
    assert first["model"] == "fake-instruct" and first["stop"] == ["\n"]
    assert first["temperature"] == 0 and first["prompt"] == "Fill in a character.\nName:"
    assert state.stats.prompt_tokens("gen") == sum(
        len(_tokens(body["prompt"])) for _, body in FakeOpenAI.requests
    )
    meta = state.get_meta_info("name")
    assert meta is not None and meta["completion_tokens"] == 2  # " Ada", " Lovelace"
    assert meta["finish_reason"] == {"type": "stop"}


def test_speculation_makes_one_call_and_produces_the_same_values(base_url: str) -> None:
    spec = rm.function(num_api_spec_tokens=64)(character)
    state = spec.run(backend=completion_backend(base_url), temperature=0)
    assert {k: state[k] for k in EXPECTED} == EXPECTED
    assert state.text() == (
        "Fill in a character.\nName: Ada Lovelace\nBirthday: December 10, 1815\n"
        "Job: Mathematician\n"
    )
    assert len(FakeOpenAI.requests) == 1
    body = FakeOpenAI.requests[0][1]
    assert "stop" not in body and body["max_tokens"] == 64  # generates past the first gen


def test_speculation_recalls_on_a_mismatch(base_url: str) -> None:
    @rm.function(num_api_spec_tokens=64)
    def off_script(s: rm.ProgramState) -> None:
        s += "Name:" + rm.gen("name", stop="\n") + "\nHobby:" + rm.gen("hobby", stop="\n")

    state = off_script.run(backend=completion_backend(base_url))
    assert state["name"] == " Ada Lovelace"
    assert state["hobby"] == "Name: Ada Lovelace"  # the fake's answer to an unknown field
    # "\nHobby:" does not match the speculated "\nBirthday:...": the next gen calls again
    assert len(FakeOpenAI.requests) == 2
    assert FakeOpenAI.requests[1][1]["prompt"].endswith("Ada Lovelace\nHobby:")


def test_speculated_gen_without_stop_is_cut_at_max_tokens_characters(base_url: str) -> None:
    @rm.function(num_api_spec_tokens=8)
    def prog(s: rm.ProgramState) -> None:
        s += "Name:" + rm.gen("a", max_tokens=4) + rm.gen("b", max_tokens=4)

    state = prog.run(backend=completion_backend(base_url))
    assert state["a"] == " Ada" and state["b"] == " Lov"  # SGLang cuts speculation by chars
    assert len(FakeOpenAI.requests) == 1


def test_streaming_over_sse_equals_the_plain_run(base_url: str) -> None:
    prog = rm.function(character)
    streamed = prog.run(backend=completion_backend(base_url), stream=True)
    chunks = list(streamed.text_iter())
    plain = prog.run(backend=completion_backend(base_url))
    assert "".join(chunks) == plain.text() == streamed.text()
    assert len(chunks) > 6  # token by token, not one piece per gen
    assert FakeOpenAI.requests[0][1]["stream"] is True
    assert streamed.stats.prompt_tokens() == plain.stats.prompt_tokens() > 0


def test_chat_model_gets_the_messages(base_url: str) -> None:
    backend = rm.OpenAI("fake-chat", base_url=base_url, api_key="k")
    assert backend.is_chat_model

    @rm.function
    def chat(s: rm.ProgramState) -> None:
        s += rm.system("Be brief.")
        s += rm.user("  Hi there")
        s += rm.assistant(rm.gen("reply", max_tokens=8))

    state = chat.run(backend=backend)
    assert state["reply"] == "Hello from chat."
    path, body = FakeOpenAI.requests[0]
    assert path == "/v1/chat/completions" and body["max_tokens"] == 8
    assert body["messages"] == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Hi there"},  # leading whitespace stripped, as SGLang
    ]
    assert state.messages()[-1] == {"role": "assistant", "content": "Hello from chat."}


def test_chat_model_needs_gen_right_after_assistant(base_url: str) -> None:
    backend = rm.OpenAI("fake-chat", base_url=base_url, api_key="k")

    @rm.function
    def bad(s: rm.ProgramState) -> None:
        s += rm.user("Hi") + rm.assistant("Sure: " + rm.gen("x"))

    with pytest.raises(rm.ProgramError, match="right after the assistant role opens"):
        bad.run(backend=backend)["x"]
    assert FakeOpenAI.requests == []


@rm.function(num_api_spec_tokens=48)
def chat_character(s: rm.ProgramState, first_field: str) -> None:
    s += rm.user("Construct a character.")
    s += rm.assistant(
        first_field
        + rm.gen("name", stop="\n")
        + "\nBirthday:"
        + rm.gen("birthday", stop="\n")
        + "\nJob:"
        + rm.gen("job", stop="\n")
    )


def test_chat_speculation_fills_a_whole_turn_with_one_call(base_url: str) -> None:
    backend = rm.OpenAI("fake-chat-doc", base_url=base_url, api_key="k")
    state = chat_character.run(first_field="Name:", backend=backend)
    assert {k: state[k] for k in EXPECTED} == EXPECTED
    assert len(FakeOpenAI.requests) == 1
    body = FakeOpenAI.requests[0][1]
    assert body["max_tokens"] == 48 and "stop" not in body
    assert body["messages"] == [{"role": "user", "content": "Construct a character."}]
    assert state.messages()[-1]["content"] == (
        "Name: Ada Lovelace\nBirthday: December 10, 1815\nJob: Mathematician"
    )


def test_chat_speculation_that_never_fits_fails_after_three_calls(base_url: str) -> None:
    backend = rm.OpenAI("fake-chat-doc", base_url=base_url, api_key="k")
    state = chat_character.run(first_field="Hobby:", backend=backend)
    with pytest.raises(rm.ProgramError, match="did not fit the program's template"):
        state["name"]
    state.wait()
    assert len(FakeOpenAI.requests) == 3


def test_http_errors_and_select_fail_clearly(base_url: str) -> None:
    broken = rm.OpenAI("broken", base_url=base_url, api_key="k", is_chat_model=False)
    state = rm.function(character).run(backend=broken)
    with pytest.raises(rm.ProgramError) as info:
        state["name"]
    root = state.error()
    assert isinstance(root, rm.BackendError) and root.code == "HTTP_400"
    assert "model 'broken' does not exist" in str(root) and info.value.__cause__ is not None

    @rm.function
    def pick(s: rm.ProgramState) -> None:
        s += "Yes or no?" + rm.select("a", [" yes", " no"])

    with pytest.raises(rm.ProgramError, match="select needs prompt logprobs"):
        pick.run(backend=completion_backend(base_url))["a"]


def test_unreachable_server_is_unavailable() -> None:
    backend = rm.OpenAI("m", base_url="http://127.0.0.1:9/v1", api_key="k", is_chat_model=False)
    state = rm.function(character).run(backend=backend)
    root = state.error()
    assert isinstance(root, rm.BackendError) and root.code == "UNAVAILABLE"


def test_measurement_script_reports_fewer_calls_and_tokens(
    base_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    report = dsl_spec.main(["--base-url", base_url, "--model", "fake-instruct", "--programs", "2"])
    printed = json.loads(capsys.readouterr().out)
    assert printed == report
    plain, spec = report["without_speculation"], report["with_speculation"]
    assert plain["outputs"] == spec["outputs"]  # same values either way
    assert plain["calls"] == 6 and spec["calls"] == 2
    assert spec["prompt_tokens"] < plain["prompt_tokens"] / 2
