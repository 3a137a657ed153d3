"""The OpenAI-compatible HTTP API, spoken to with the real `openai` SDK against the session
stack: chat and completions, streamed and not, n, stop, logprobs, json_schema, penalties,
errors as the SDK's exception classes, and a disconnect that frees its request."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any

import grpc
import jsonschema
import openai
import pytest
import requests

from radixmesh_wire.pb import api_pb2, api_pb2_grpc
from tests.conftest import Stack

pytestmark = pytest.mark.integration

PROMPT = "Here is a list of animals: cat, dog, horse,"


@pytest.fixture(scope="module")
def client(stack: Stack) -> Iterator[openai.OpenAI]:
    c = openai.OpenAI(base_url=stack.http_url + "/v1", api_key="unused", max_retries=0)
    yield c
    c.close()


@pytest.fixture(scope="module")
def model(client: openai.OpenAI) -> str:
    models = client.models.list().data
    assert len(models) == 1
    return models[0].id


def test_retrieve_one_model(client: openai.OpenAI, model: str) -> None:
    card = client.models.retrieve(model)
    assert card.id == model and card.object == "model"
    assert card == client.models.list().data[0]
    with pytest.raises(openai.NotFoundError) as err:
        client.models.retrieve("no-such-model")
    assert err.value.body["code"] == "model_not_found"  # type: ignore[index]


def _stats(stack: Stack) -> api_pb2.Stats:
    with grpc.insecure_channel(stack.endpoint) as chan:
        return api_pb2_grpc.RadixMeshStub(chan).GetStats(api_pb2.GetStatsRequest(), timeout=5)


def test_completions_plain_and_streamed_agree(client: openai.OpenAI, model: str) -> None:
    args: dict[str, Any] = {"model": model, "prompt": PROMPT, "max_tokens": 12, "temperature": 0}
    plain = client.completions.create(**args, extra_body={"ignore_eos": True})
    assert plain.object == "text_completion" and len(plain.choices) == 1
    ch = plain.choices[0]
    assert ch.finish_reason == "length" and ch.text
    assert plain.usage is not None and plain.usage.completion_tokens == 12
    assert plain.usage.total_tokens == plain.usage.prompt_tokens + 12
    parts = list(
        client.completions.create(
            **args,
            stream=True,
            stream_options={"include_usage": True},
            extra_body={"ignore_eos": True},
        )
    )
    text = "".join(p.choices[0].text for p in parts if p.choices)
    assert text == ch.text
    finals = [p.choices[0].finish_reason for p in parts if p.choices]
    assert finals[-1] == "length" and set(finals[:-1]) == {None}
    assert parts[-1].choices == [] and parts[-1].usage is not None
    assert parts[-1].usage.completion_tokens == 12
    # the prompt was just computed by the first call: the radix cache serves it
    details = parts[-1].usage.prompt_tokens_details
    assert details is not None and details.cached_tokens >= plain.usage.prompt_tokens - 1


def test_chat_plain_streamed_stop_and_logprobs(client: openai.OpenAI, model: str) -> None:
    msgs = [{"role": "user", "content": "List three animals."}]
    args: dict[str, Any] = {"model": model, "messages": msgs, "max_tokens": 10, "temperature": 0}
    plain = client.chat.completions.create(**args, logprobs=True, top_logprobs=2)
    msg = plain.choices[0].message
    assert msg.role == "assistant" and msg.content
    lps = plain.choices[0].logprobs
    assert lps is not None and lps.content is not None
    assert "".join(t.token for t in lps.content) == msg.content
    for t in lps.content:
        assert len(t.top_logprobs) == 2
        assert t.top_logprobs[0].token == t.token  # greedy picks the most likely
        assert t.logprob == pytest.approx(t.top_logprobs[0].logprob, abs=1e-4)
    chunks = list(client.chat.completions.create(**args, stream=True))
    assert chunks[0].choices[0].delta.role == "assistant"
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == msg.content
    # a stop string from the middle of the known output ends the text right before it
    words = msg.content.split()
    assert len(words) >= 2, msg.content
    stop = words[1]
    cut = msg.content.index(stop)
    stopped = client.chat.completions.create(**args, stop=[stop])
    assert stopped.choices[0].message.content == msg.content[:cut]
    assert stopped.choices[0].finish_reason == "stop"


def test_n_choices_share_one_prefill(stack: Stack, client: openai.OpenAI, model: str) -> None:
    prompt = "A long, unique prompt about the history of lighthouses on rocky coasts, " * 3
    before = _stats(stack)
    res = client.completions.create(
        model=model,
        prompt=prompt,
        max_tokens=4,
        temperature=1.0,
        seed=5,
        n=3,
        extra_body={"ignore_eos": True},
    )
    after = _stats(stack)
    assert [c.index for c in res.choices] == [0, 1, 2]
    assert res.usage is not None and res.usage.completion_tokens == 12
    p = res.usage.prompt_tokens
    # one prefill computed the prompt: the 3 choices matched all of it but the last token
    computed = (after.prompt_tokens - before.prompt_tokens) - (
        after.cached_prompt_tokens - before.cached_prompt_tokens
    )
    assert after.prompt_tokens - before.prompt_tokens == 4 * p
    assert computed <= p + 3, (computed, p)
    # seeded choices are reproducible one by one: choice i used seed 5 + i
    again = client.completions.create(
        model=model, prompt=prompt, max_tokens=4, seed=6, extra_body={"ignore_eos": True}
    )
    assert again.choices[0].text == res.choices[1].text


def test_json_schema_output_validates(client: openai.OpenAI, model: str) -> None:
    schema = {
        "type": "object",
        "properties": {"name": {"type": "string", "maxLength": 8}, "age": {"type": "integer"}},
        "required": ["name", "age"],
        "additionalProperties": False,
    }
    res = client.chat.completions.create(
        model=model,
        messages=[{"role": "user", "content": "Give a person as JSON."}],
        max_tokens=40,
        temperature=0,
        response_format={
            "type": "json_schema",
            "json_schema": {"name": "person", "schema": schema, "strict": True},
        },
    )
    content = res.choices[0].message.content
    assert content is not None
    jsonschema.validate(json.loads(content), schema)


def test_penalties_and_logit_bias_change_output(
    stack: Stack, client: openai.OpenAI, model: str
) -> None:
    args: dict[str, Any] = {
        "model": model,
        "prompt": "cat cat cat cat cat",
        "max_tokens": 8,
        "temperature": 0,
    }
    base = client.completions.create(**args).choices[0]
    freq = client.completions.create(**args, frequency_penalty=2.0).choices[0]
    assert freq.text != base.text
    rep = client.completions.create(**args, extra_body={"repetition_penalty": 1.8}).choices[0]
    assert rep.text != base.text
    # a +100 bias on one token makes greedy decoding pick it every time
    with grpc.insecure_channel(stack.endpoint) as chan:
        stub = api_pb2_grpc.RadixMeshStub(chan)
        tid = stub.Tokenize(api_pb2.TokenizeRequest(text=" zebra")).ids[0]
        want = stub.Detokenize(api_pb2.DetokenizeRequest(ids=[tid] * 3)).text
    forced = client.completions.create(**{**args, "max_tokens": 3}, logit_bias={str(tid): 100})
    assert forced.choices[0].text == want


def test_errors_arrive_as_sdk_exceptions(client: openai.OpenAI, model: str) -> None:
    with pytest.raises(openai.NotFoundError) as nf:
        client.completions.create(model="no-such-model", prompt="hi", max_tokens=1)
    assert "no-such-model" in nf.value.message
    with pytest.raises(openai.BadRequestError) as bad:
        client.completions.create(model=model, prompt="hi", max_tokens=1, temperature=-1)
    assert "temperature" in bad.value.message
    with pytest.raises(openai.BadRequestError) as long_:
        client.completions.create(model=model, prompt="hi " * 9000, max_tokens=1)
    assert "context window" in long_.value.message
    with pytest.raises(openai.UnprocessableEntityError) as typ:
        client.completions.create(model=model, prompt="hi", max_tokens="three")  # type: ignore[call-overload]
    assert "max_tokens" in typ.value.message
    with pytest.raises(openai.BadRequestError):
        client.chat.completions.create(model=model, messages=[], max_tokens=1)


def test_errors_name_openais_fields(client: openai.OpenAI, model: str) -> None:
    """The core's checks speak the gRPC API's names; OpenAI's clients read theirs."""
    with pytest.raises(openai.BadRequestError) as big:
        client.completions.create(model=model, prompt="hi", max_tokens=10**6)
    assert big.value.param == "max_tokens"  # type: ignore[attr-defined]
    assert "max_tokens=1000000" in big.value.message and "max_new_tokens" not in big.value.message
    with pytest.raises(openai.BadRequestError) as low:
        client.completions.create(
            model=model, prompt="hi", max_tokens=2, extra_body={"min_tokens": 5}
        )
    assert low.value.param == "min_tokens"  # type: ignore[attr-defined]
    assert "min_tokens=5 exceeds max_tokens=2" in low.value.message
    with pytest.raises(openai.BadRequestError) as temp:
        client.chat.completions.create(
            model=model, messages=[{"role": "user", "content": "x"}], temperature=-1
        )
    assert temp.value.param == "temperature"  # type: ignore[attr-defined]


def test_unsupported_fields_are_named_400s(client: openai.OpenAI, model: str) -> None:
    msgs = [{"role": "user", "content": "hi"}]
    cases = [
        ({"audio": {"voice": "alloy", "format": "wav"}, "modalities": ["text", "audio"]}, "audio"),
        ({"prediction": {"type": "content", "content": "x"}}, "prediction"),
        ({"web_search_options": {}}, "web_search_options"),
        ({"frobnicate": True}, "frobnicate"),
    ]
    for extra, param in cases:
        with pytest.raises(openai.BadRequestError) as err:
            client.chat.completions.create(
                model=model,
                messages=msgs,  # type: ignore[arg-type]
                max_tokens=1,
                extra_body=extra,  # type: ignore[arg-type]
            )
        assert err.value.param == param, (param, err.value.message)  # type: ignore[attr-defined]
        assert err.value.code == "unsupported_parameter"
        assert f"'{param}' is not supported" in err.value.message
    with pytest.raises(openai.BadRequestError) as suffix:
        client.completions.create(model=model, prompt="hi", max_tokens=1, suffix="end")
    assert suffix.value.param == "suffix"  # type: ignore[attr-defined]


def test_body_too_large_is_413(stack: Stack) -> None:
    r = requests.post(
        stack.http_url + "/v1/completions",
        data=b'{"prompt": "' + b"a" * (33 << 20) + b'"}',
        headers={"Content-Type": "application/json"},
        timeout=30,
    )
    assert r.status_code == 413
    assert r.json()["error"]["code"] == "request_too_large"


def test_disconnect_mid_stream_frees_the_request(stack: Stack, model: str) -> None:
    body: dict[str, Any] = {
        "model": model,
        "prompt": PROMPT,
        "max_tokens": 2000,
        "temperature": 0,
        "ignore_eos": True,
        "stream": True,
    }
    with requests.post(stack.http_url + "/v1/completions", json=body, stream=True, timeout=30) as r:
        assert r.status_code == 200
        lines = r.iter_lines(decode_unicode=True)
        first = next(str(line) for line in lines if str(line).startswith("data: "))
        assert json.loads(first[6:])["choices"][0]["index"] == 0
        assert _stats(stack).running_requests >= 1
    # closed: the handler is cancelled, the request aborted, its slots freed
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        s = _stats(stack)
        if s.running_requests == 0 and s.queue_length == 0 and s.frontend_inflight == 0:
            break
        time.sleep(0.05)
    s = _stats(stack)
    assert (s.running_requests, s.queue_length, s.frontend_inflight) == (0, 0, 0)
    assert s.kv_request_owned == 0


def test_health_ready_and_models(stack: Stack, model: str) -> None:
    assert requests.get(stack.http_url + "/health").status_code == 200
    ready = requests.get(stack.http_url + "/ready")
    assert ready.status_code == 200 and ready.json() == {"ready": True}
    r = requests.get(stack.http_url + "/v1/nope")
    assert r.status_code == 404 and r.json()["error"]["type"] == "not_found_error"


def test_grpc_api_takes_the_same_penalties(stack: Stack) -> None:
    from radixmesh.api import Client, RadixMeshError

    args: dict[str, Any] = {"prompt": "cat cat cat cat cat", "max_new_tokens": 8, "temperature": 0}
    with Client(stack.endpoint) as c:
        base = c.generate(**args)
        pen = c.generate(**args, frequency_penalty=2.0)
        same = c.generate(**args, presence_penalty=0.0, repetition_penalty=1.0)
        two = {**args, "max_new_tokens": 2}
        biased = c.generate(**two, logit_bias={base.output_ids[0] + 1: 100})
        with pytest.raises(RadixMeshError) as bad:
            c.generate(**args, presence_penalty=3.0)
    assert pen.output_ids != base.output_ids
    assert same.output_ids == base.output_ids  # neutral values change nothing
    assert biased.output_ids == [base.output_ids[0] + 1] * 2
    assert bad.value.code == grpc.StatusCode.INVALID_ARGUMENT
    assert "presence_penalty" in bad.value.message


def test_echo_logprobs_and_extensions(client: openai.OpenAI, model: str) -> None:
    res = client.completions.create(
        model=model, prompt=PROMPT, max_tokens=2, temperature=0, echo=True, logprobs=1
    )
    ch = res.choices[0]
    assert res.usage is not None and ch.text.startswith(PROMPT)
    lp = ch.logprobs
    assert lp is not None and lp.tokens is not None and lp.token_logprobs is not None
    assert len(lp.tokens) == res.usage.prompt_tokens + res.usage.completion_tokens
    assert lp.token_logprobs[0] is None  # nothing precedes the first prompt token
    assert all(v is not None and v <= 0 for v in lp.token_logprobs[1:])
    assert "".join(lp.tokens) == ch.text
    picked = client.completions.create(
        model=model,
        prompt="Is water wet? Answer:",
        max_tokens=4,
        temperature=0.7,
        seed=1,
        extra_body={"regex": " (yes|no)", "top_k": 5, "min_p": 0.05},
    )
    assert picked.choices[0].text in (" yes", " no")
