"""SGLang's native HTTP API, driven with request bodies recorded in the shape SGLang's own
clients send them (`sglang.bench_serving --backend sglang`, `sgl.RuntimeEndpoint`), and every
response field those clients read checked. The bodies are copied field for field, including
the fields RadixMesh ignores (lora_path, spaces_between_special_tokens)."""

from __future__ import annotations

import json
import math
from typing import Any

import pytest
import requests

from tests.conftest import Stack

pytestmark = pytest.mark.integration

PROMPT = "Here is a list of animals: cat, dog, horse,"


def _sse(resp: requests.Response) -> list[dict]:
    """The way bench_serving reads the stream: strip 'data: ', stop at [DONE]."""
    out: list[dict] = []
    done = False
    for raw in resp.iter_lines():
        chunk = raw.strip()
        if not chunk:
            continue
        text = chunk.decode()
        text = text[len("data: ") :] if text.startswith("data: ") else text
        if text == "[DONE]":
            done = True
            continue
        assert not done, "data after [DONE]"
        out.append(json.loads(text))
    assert done
    return out


def test_bench_serving_body_streamed(stack: Stack) -> None:
    # async_request_sglang_generate's payload (return_logprob off, ignore_eos on)
    payload: dict[str, Any] = {
        "text": PROMPT,
        "sampling_params": {"temperature": 0.0, "max_new_tokens": 10, "ignore_eos": True},
        "stream": True,
        "lora_path": None,
        "return_logprob": False,
        "logprob_start_len": -1,
    }
    with requests.post(stack.http_url + "/generate", json=payload, stream=True) as r:
        assert r.status_code == 200
        events = _sse(r)
    # the fields it reads: text (cumulative), meta_info.completion_tokens (cumulative)
    texts = [e["text"] for e in events if e.get("text")]
    counts = [e["meta_info"]["completion_tokens"] for e in events if e.get("text")]
    assert counts == sorted(counts) and counts[-1] == 10
    assert all(b.startswith(a) for a, b in zip(texts, texts[1:], strict=False))
    plain = requests.post(stack.http_url + "/generate", json={**payload, "stream": False})
    assert plain.status_code == 200
    body = plain.json()
    assert texts[-1] == body["text"]
    meta = body["meta_info"]
    assert meta["completion_tokens"] == 10
    assert meta["finish_reason"] == {"type": "length", "length": 10}
    assert meta["prompt_tokens"] > 0 and 0 <= meta["cached_tokens"] < meta["prompt_tokens"]
    assert events[-1]["meta_info"]["finish_reason"]["type"] == "length"


def test_runtime_endpoint_generate_body(stack: Stack) -> None:
    # RuntimeEndpoint.generate: skip/space flags plus SglSamplingParams.to_srt_kwargs()
    data: dict[str, Any] = {
        "text": "The capital of France is",
        "sampling_params": {
            "skip_special_tokens": True,
            "spaces_between_special_tokens": True,
            "max_new_tokens": 6,
            "stop": [],
            "stop_token_ids": [],
            "temperature": 0,
            "top_p": 1.0,
            "top_k": -1,
            "min_p": 0.0,
            "frequency_penalty": 0.0,
            "presence_penalty": 0.0,
            "ignore_eos": False,
            "regex": None,
            "json_schema": None,
        },
    }
    r = requests.post(stack.http_url + "/generate", json=data)
    assert r.status_code == 200, r.text
    obj = r.json()
    assert isinstance(obj["text"], str) and obj["text"]
    meta = obj["meta_info"]
    assert meta["prompt_tokens"] > 0 and 1 <= meta["completion_tokens"] <= 6
    assert meta["finish_reason"]["type"] in ("stop", "length")
    # generate_stream: same body with stream=True, read as data["text"][pos:]
    with requests.post(
        stack.http_url + "/generate", json={**data, "stream": True}, stream=True
    ) as s:
        pos, pieces = 0, []
        for e in _sse(s):
            pieces.append(e["text"][pos:])
            pos += len(pieces[-1])
            assert "meta_info" in e
    assert "".join(pieces) == obj["text"]
    # regex constraint through sampling_params (what `sgl.gen(regex=...)` sends)
    rx = requests.post(
        stack.http_url + "/generate",
        json={**data, "sampling_params": {**data["sampling_params"], "regex": "(Paris|Lyon)"}},
    )
    assert rx.json()["text"] in ("Paris", "Lyon")


def test_runtime_endpoint_select_bodies(stack: Stack) -> None:
    """RuntimeEndpoint.select: cache the prefix, then score every choice's prompt tokens."""
    url = stack.http_url + "/generate"
    prefix = "Q: Is the sky blue?\nA:"
    cached = requests.post(url, json={"text": prefix, "sampling_params": {"max_new_tokens": 0}})
    assert cached.status_code == 200
    prompt_len = cached.json()["meta_info"]["prompt_tokens"]
    assert cached.json()["text"] == ""
    choices = [" yes", " no"]
    start = max(prompt_len - 2, 0)
    data: dict[str, Any] = {
        "text": [prefix + c for c in choices],
        "sampling_params": {"max_new_tokens": 0, "temperature": 0},
        "return_logprob": True,
        "return_text_in_logprobs": True,
        "logprob_start_len": start,
    }
    obj = requests.post(url, json=data).json()
    assert isinstance(obj, list) and len(obj) == 2
    for res, c in zip(obj, choices, strict=True):
        inp = res["meta_info"]["input_token_logprobs"]
        # one [logprob, token_id, text] per prompt token from `start` on
        assert len(inp) == res["meta_info"]["prompt_tokens"] - start
        assert all(len(x) == 3 and isinstance(x[1], int) for x in inp)
        assert all(isinstance(x[0], float) and x[0] <= 0 for x in inp)
        assert "".join(x[2] for x in inp).endswith(c)
        assert res["meta_info"]["output_token_logprobs"] == []
        values = [x[0] for x in inp if x[0]]
        assert math.isfinite(sum(values) / len(values))  # compute_normalized_prompt_logprobs
    # unconditional logprobs: input_ids batch, logprob_start_len left at its default
    ids = [[x[1] for x in r["meta_info"]["input_token_logprobs"]] for r in obj]
    un = requests.post(
        url,
        json={"input_ids": ids, "sampling_params": {"max_new_tokens": 0}, "return_logprob": True},
    ).json()
    for r, want in zip(un, ids, strict=True):
        got = r["meta_info"]["input_token_logprobs"]
        assert [x[1] for x in got] == want[-1:]  # SGLang's default start: the last token
        assert got[0][2] is None  # no text unless return_text_in_logprobs


def test_logprobs_from_zero_and_top(stack: Stack) -> None:
    r = requests.post(
        stack.http_url + "/generate",
        json={
            "text": PROMPT,
            "sampling_params": {"max_new_tokens": 3, "temperature": 0},
            "return_logprob": True,
            "logprob_start_len": 0,
            "top_logprobs_num": 2,
        },
    ).json()
    meta = r["meta_info"]
    inp = meta["input_token_logprobs"]
    assert len(inp) == meta["prompt_tokens"] and inp[0][0] is None  # nothing precedes token 0
    assert len(meta["output_token_logprobs"]) == 3
    assert [len(t) for t in meta["output_top_logprobs"]] == [2, 2, 2]
    for chosen, top in zip(meta["output_token_logprobs"], meta["output_top_logprobs"], strict=True):
        assert top[0][1] == chosen[1]  # greedy: the chosen token is the most likely
    assert [x[1] for x in meta["output_token_logprobs"]] == r["output_ids"]


def test_info_flush_and_health(stack: Stack) -> None:
    base = stack.http_url
    info = requests.get(base + "/get_model_info").json()
    assert info["model_path"] and info["is_generation"] is True
    assert requests.get(base + "/model_info").json() == info  # SGLang >= 0.5 (bench_serving)
    for path in ("/server_info", "/get_server_info"):
        si = requests.get(base + path).json()
        assert si["internal_states"][0]["max_total_num_tokens"] > 0
    assert requests.get(base + "/health").status_code == 200
    assert requests.get(base + "/health_generate").status_code == 200
    # RuntimeEndpoint.flush_cache's body; the stack is idle between tests
    r = requests.post(base + "/flush_cache", json={"empty_cache": True})
    assert r.status_code == 200, r.text
    assert r.text.startswith("Cache flushed")
    again = requests.post(
        base + "/generate", json={"text": PROMPT, "sampling_params": {"max_new_tokens": 1}}
    ).json()
    assert again["meta_info"]["cached_tokens"] == 0  # nothing survived the flush


def test_errors(stack: Stack) -> None:
    url = stack.http_url + "/generate"
    r = requests.post(url, json={"sampling_params": {}})
    assert r.status_code == 400 and "text" in r.json()["error"]["message"]
    r = requests.post(url, json={"text": "hi", "sampling_params": {"temperature": -1}})
    assert r.status_code == 400 and "temperature" in r.json()["error"]["message"]
    r = requests.post(url, data=b"{not json", headers={"Content-Type": "application/json"})
    assert r.status_code == 400
