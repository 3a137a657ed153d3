"""OpenAI and SGLang request bodies -> the core's GenerateInput: every field lands where the
gRPC API would put it, type errors are 422 and bad values 400, with the field named."""

from __future__ import annotations

import json

import pytest

from tokenizer_service.http.errors import HttpError
from tokenizer_service.http.openai_params import parse_chat, parse_completion
from tokenizer_service.http.sglang import _parse as parse_sglang


def test_chat_fields_reach_sampling() -> None:
    req = parse_chat(
        {
            "model": "m",
            "messages": [
                {"role": "system", "content": "be brief"},
                {
                    "role": "user",
                    "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}],
                },
            ],
            "max_completion_tokens": 7,
            "temperature": 0.5,
            "top_p": 0.9,
            "top_k": 5,
            "min_p": 0.1,
            "seed": 3,
            "stop": "END",
            "presence_penalty": 0.5,
            "frequency_penalty": -0.5,
            "repetition_penalty": 1.1,
            "logit_bias": {"42": -100, "7": 2},
            "min_tokens": 2,
            "ignore_eos": True,
            "logprobs": True,
            "top_logprobs": 3,
            "n": 2,
            "stream": True,
            "stream_options": {"include_usage": True},
            "user": "u1",
        }
    )
    (inp,) = req.inputs
    assert inp.messages == [
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": "ab"},
    ]
    s = inp.sampling
    assert (s.max_new_tokens, s.top_k, s.seed, s.min_new_tokens) == (7, 5, 3, 2)
    assert s.temperature == pytest.approx(0.5) and s.top_p == pytest.approx(0.9)
    assert s.presence_penalty == pytest.approx(0.5)
    assert s.frequency_penalty == pytest.approx(-0.5)
    assert s.repetition_penalty == pytest.approx(1.1)
    assert dict(s.logit_bias) == {42: -100.0, 7: 2.0}
    assert list(s.stop) == ["END"] and s.ignore_eos and s.skip_special_tokens
    assert inp.logprobs.return_logprob and inp.logprobs.top_logprobs == 3
    assert (req.n, req.stream, req.include_usage, req.user) == (2, True, True, "u1")


def test_completion_prompts_echo_and_response_format() -> None:
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}}
    req = parse_completion(
        {
            "prompt": [[1, 2, 3], [4, 5]],
            "echo": True,
            "logprobs": 2,
            "response_format": {
                "type": "json_schema",
                "json_schema": {"name": "x", "schema": schema},
            },
        },
        20,
    )
    assert [i.input_ids for i in req.inputs] == [[1, 2, 3], [4, 5]]
    for inp in req.inputs:
        assert json.loads(inp.sampling.json_schema) == schema
        assert inp.logprobs.prompt_logprobs_from == 0 and inp.logprobs.top_logprobs == 2
    assert [i.text for i in parse_completion({"prompt": ["a", "b"]}, 20).inputs] == ["a", "b"]
    obj = parse_completion({"prompt": "a", "response_format": {"type": "json_object"}}, 20)
    assert json.loads(obj.inputs[0].sampling.json_schema) == {"type": "object"}


@pytest.mark.parametrize(
    "body,status,param",
    [
        ({"prompt": "a", "max_tokens": "3"}, 422, "max_tokens"),
        ({"prompt": "a", "temperature": True}, 422, "temperature"),
        ({"prompt": "a", "stop": [1]}, 422, "stop"),
        ({"prompt": 5}, 422, "prompt"),
        ({"prompt": []}, 422, "prompt"),
        ({"prompt": "a", "n": 0}, 400, "n"),
        ({"prompt": "a", "n": 2, "best_of": 3}, 400, "best_of"),
        ({"prompt": "a", "logprobs": 99}, 400, "logprobs"),
        ({"prompt": "a", "logit_bias": {"x": 1}}, 400, "logit_bias"),
        ({"prompt": "a", "stream_options": {"include_usage": True}}, 400, "stream_options"),
        ({"prompt": "a", "regex": "a", "ebnf": "b"}, 400, "ebnf"),
        ({"prompt": "a", "response_format": {"type": "xml"}}, 400, "response_format"),
        ({"prompt": "a", "seed": -1}, 400, "seed"),
    ],
)
def test_completion_errors(body: dict, status: int, param: str) -> None:
    with pytest.raises(HttpError) as e:
        parse_completion(body, 20)
    assert (e.value.status, e.value.param) == (status, param)
    assert param.split("[")[0] in e.value.message or e.value.param == param


@pytest.mark.parametrize(
    "body,status",
    [
        ({"messages": "hi"}, 422),
        ({"messages": []}, 400),
        ({"messages": [{"content": "x"}]}, 422),
        ({"messages": [{"role": "user", "content": [{"type": "image_url"}]}]}, 400),
        ({"messages": [{"role": "user", "content": "x"}], "top_logprobs": 2}, 400),
    ],
)
def test_chat_errors(body: dict, status: int) -> None:
    with pytest.raises(HttpError) as e:
        parse_chat(body)
    assert e.value.status == status


def test_sglang_body_maps_names_and_batches() -> None:
    req = parse_sglang(
        {
            "text": ["a", "b"],
            "sampling_params": {
                "max_new_tokens": 4,
                "min_new_tokens": 1,
                "temperature": 0,
                "spaces_between_special_tokens": True,
                "regex": "(x|y)",
            },
            "return_logprob": True,
            "logprob_start_len": 3,
            "top_logprobs_num": 2,
            "lora_path": None,
        },
        4096,
    )
    assert req.batch and [i.text for i in req.inputs] == ["a", "b"]
    s = req.inputs[0].sampling
    assert (s.max_new_tokens, s.min_new_tokens, s.regex) == (4, 1, "(x|y)")
    assert req.inputs[0].logprobs.prompt_logprobs_from == 3 and req.top_n == 2
    single = parse_sglang({"input_ids": [1, 2], "sampling_params": {}}, 4096)
    assert not single.batch and single.inputs[0].input_ids == [1, 2]
    with pytest.raises(HttpError) as e:
        parse_sglang({"text": "a", "input_ids": [1]}, 4096)
    assert e.value.status == 400


@pytest.mark.parametrize(
    "body,param",
    [
        ({"prompt": "a", "frobnicate": 1}, "frobnicate"),
        ({"prompt": "a", "stream_options": {"include_usage": True, "x": 1}}, "stream_options.x"),
        ({"prompt": "a", "response_format": {"type": "text", "extra": 1}}, "response_format.extra"),
    ],
)
def test_unsupported_completion_fields_are_named_400s(body: dict, param: str) -> None:
    with pytest.raises(HttpError) as e:
        parse_completion(body, 20)
    assert (e.value.status, e.value.param, e.value.code) == (400, param, "unsupported_parameter")
    assert f"'{param}' is not supported" in e.value.message


@pytest.mark.parametrize(
    "extra,param",
    [
        ({"audio": {"voice": "x", "format": "wav"}}, "audio"),
        ({"modalities": ["text", "audio"]}, "modalities"),
        ({"functions": [{"name": "f"}]}, "functions"),
        ({"prediction": {"type": "content", "content": "x"}}, "prediction"),
        ({"messages": [{"role": "user", "content": "x", "bogus": 1}]}, "messages[0].bogus"),
    ],
)
def test_unsupported_chat_fields_are_named_400s(extra: dict, param: str) -> None:
    body = {"messages": [{"role": "user", "content": "hi"}], **extra}
    with pytest.raises(HttpError) as e:
        parse_chat(body)
    assert (e.value.status, e.value.param) == (400, param)


def test_null_fields_are_absent_fields() -> None:
    req = parse_chat(
        {
            "messages": [{"role": "assistant", "content": "x", "refusal": None, "audio": None}],
            "frobnicate": None,
            "temperature": None,
        }
    )
    assert not req.inputs[0].sampling.HasField("temperature")


def test_type_errors_name_the_field_and_its_shape() -> None:
    with pytest.raises(HttpError) as e:
        parse_completion({"prompt": "a", "max_tokens": "3"}, 20)
    assert e.value.message == "'max_tokens' must be an integer"
    with pytest.raises(HttpError) as e:
        parse_chat({"messages": [{"role": "user", "content": 5}]})
    assert (e.value.status, e.value.param) == (422, "messages[0].content")
    assert "a string or a list of parts" in e.value.message
    with pytest.raises(HttpError) as e:
        parse_completion({"prompt": "a", "n": 17}, 20)
    assert e.value.status == 400 and "less than or equal to 16" in e.value.message


def test_core_errors_speak_openais_names() -> None:
    from tokenizer_service.http.openai_params import openai_field

    msg = "max_new_tokens=5000 goes beyond the context window: ... so at most 4000"
    assert openai_field(msg, "max_new_tokens") == (
        "max_tokens=5000 goes beyond the context window: ... so at most 4000",
        "max_tokens",
    )
    assert openai_field("min_new_tokens=3 exceeds max_new_tokens=2", "min_new_tokens") == (
        "min_tokens=3 exceeds max_tokens=2",
        "min_tokens",
    )
    assert openai_field("temperature must be >= 0, got -1.0", "temperature")[1] == "temperature"


def test_sglang_unknown_fields_are_named_and_known_ones_pass() -> None:
    with pytest.raises(HttpError) as e:
        parse_sglang({"text": "a", "lora_path": "adapter"}, 4096)
    assert (e.value.status, e.value.param) == (400, "lora_path")
    with pytest.raises(HttpError) as e:
        parse_sglang({"text": "a", "sampling_params": {"max_new_token": 3}}, 4096)
    assert e.value.param == "sampling_params.max_new_token"
    ok = parse_sglang(
        {"text": "a", "sampling_params": {"n": 1, "no_stop_trim": True, "stop": None}}, 4096
    )
    assert ok.inputs[0].text == "a"
    # what sglang.bench_serving sends (0.5.x), lora_path null when no adapter
    bench = parse_sglang(
        {
            "text": "a",
            "sampling_params": {"temperature": 0.0, "max_new_tokens": 8, "ignore_eos": True},
            "stream": True,
            "stream_options": {"include_usage": True},
            "lora_path": None,
            "return_logprob": False,
            "return_routed_experts": False,
            "logprob_start_len": -1,
        },
        4096,
    )
    assert bench.stream and bench.inputs[0].sampling.max_new_tokens == 8
    with pytest.raises(HttpError) as e:
        parse_sglang({"text": "a", "return_routed_experts": True}, 4096)
    assert e.value.param == "return_routed_experts"
