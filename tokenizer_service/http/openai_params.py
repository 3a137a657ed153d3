"""OpenAI request bodies -> the core's GenerateInput (chat and completions).

Type errors (a string where a number belongs, a missing required field) are 422, values out of
range are 400 (most of them found by the core's validation, with the same messages as the gRPC
API). Unknown fields are ignored, as vLLM and SGLang do.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from radixmesh_wire.pb import api_pb2
from tokenizer_service.core import GenerateInput
from tokenizer_service.http.errors import HttpError

MAX_N = 16  # choices per request: each one is a running request


def _type_error(name: str, want: str) -> HttpError:
    return HttpError(422, f"'{name}' must be {want}", param=name, code="invalid_type")


class Body:
    """Typed access to a JSON object; every getter returns None when the field is absent/null."""

    def __init__(self, d: dict[str, Any]) -> None:
        self.d = d

    def num(self, name: str) -> float | None:
        v = self.d.get(name)
        if v is None:
            return None
        if isinstance(v, bool) or not isinstance(v, int | float):
            raise _type_error(name, "a number")
        return float(v)

    def int_(self, name: str) -> int | None:
        v = self.d.get(name)
        if v is None:
            return None
        if isinstance(v, bool) or not isinstance(v, int):
            raise _type_error(name, "an integer")
        return v

    def bool_(self, name: str) -> bool | None:
        v = self.d.get(name)
        if v is None:
            return None
        if not isinstance(v, bool):
            raise _type_error(name, "a boolean")
        return v

    def str_(self, name: str) -> str | None:
        v = self.d.get(name)
        if v is None:
            return None
        if not isinstance(v, str):
            raise _type_error(name, "a string")
        return v

    def obj(self, name: str) -> dict[str, Any] | None:
        v = self.d.get(name)
        if v is None:
            return None
        if not isinstance(v, dict):
            raise _type_error(name, "an object")
        return v


@dataclass
class OpenAIRequest:
    model: str | None
    inputs: list[GenerateInput]  # one per prompt (completions may send several)
    n: int = 1
    stream: bool = False
    include_usage: bool = False
    echo: bool = False
    logprobs: bool = False
    top_logprobs: int = 0
    user: str | None = None
    cache_salt: str = ""  # vLLM's extension: prefix-cache isolation within the tenant
    prompt_texts: list[str] = field(default_factory=list)  # for echo


def sampling_params(b: Body) -> api_pb2.SamplingParams:
    """The sampling fields chat and completions share (OpenAI's plus SGLang/vLLM extensions)."""
    s = api_pb2.SamplingParams(skip_special_tokens=True)
    max_tokens = b.int_("max_completion_tokens")
    if max_tokens is None:
        max_tokens = b.int_("max_tokens")
    if max_tokens is not None:
        s.max_new_tokens = max_tokens
    for src, dst in (
        ("temperature", "temperature"),
        ("top_p", "top_p"),
        ("min_p", "min_p"),
        ("presence_penalty", "presence_penalty"),
        ("frequency_penalty", "frequency_penalty"),
        ("repetition_penalty", "repetition_penalty"),
    ):
        v = b.num(src)
        if v is not None:
            setattr(s, dst, v)
    for src, dst in (("top_k", "top_k"), ("min_tokens", "min_new_tokens"), ("seed", "seed")):
        v2 = b.int_(src)
        if v2 is not None:
            if dst == "seed" and v2 < 0:
                raise HttpError(400, f"seed must be >= 0, got {v2}", param="seed")
            setattr(s, dst, v2)
    for name in ("ignore_eos", "skip_special_tokens"):
        flag = b.bool_(name)
        if flag is not None:
            setattr(s, name, flag)
    s.stop.extend(_stop(b.d.get("stop")))
    ids = b.d.get("stop_token_ids")
    if ids is not None:
        if not isinstance(ids, list) or not all(_is_int(i) for i in ids):
            raise _type_error("stop_token_ids", "a list of integers")
        s.stop_token_ids.extend(ids)
    bias = b.obj("logit_bias")
    for k, v in (bias or {}).items():
        try:
            tid = int(k)
        except ValueError as exc:
            raise HttpError(
                400, f"logit_bias key {k!r} is not a token id", param="logit_bias"
            ) from exc
        if isinstance(v, bool) or not isinstance(v, int | float):
            raise _type_error("logit_bias", "an object of token id -> number")
        s.logit_bias[tid] = float(v)
    _constraint(b, s)
    return s


def _is_int(v: object) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _stop(v: object) -> list[str]:
    if v is None:
        return []
    if isinstance(v, str):
        return [v] if v else []
    if isinstance(v, list) and all(isinstance(x, str) for x in v):
        return [x for x in v if x]
    raise _type_error("stop", "a string or a list of strings")


def _constraint(b: Body, s: api_pb2.SamplingParams) -> None:
    found: list[str] = []
    rf = b.obj("response_format")
    if rf is not None:
        kind = rf.get("type")
        if kind == "json_object":
            s.json_schema = json.dumps({"type": "object"})
            found.append("response_format")
        elif kind == "json_schema":
            spec = rf.get("json_schema")
            if not isinstance(spec, dict) or not isinstance(spec.get("schema"), dict):
                raise HttpError(
                    400,
                    "response_format json_schema needs json_schema.schema (an object)",
                    param="response_format",
                )
            # Decoding is always constrained to the schema, so strict=false is served strictly.
            s.json_schema = json.dumps(spec["schema"])
            found.append("response_format")
        elif kind not in (None, "text"):
            raise HttpError(
                400,
                f"response_format type {kind!r} is not one of text, json_object, json_schema",
                param="response_format",
            )
    for name in ("regex", "ebnf", "json_schema"):
        v = b.d.get(name)
        if v is None:
            continue
        if name == "json_schema" and isinstance(v, dict):
            v = json.dumps(v)
        if not isinstance(v, str):
            raise _type_error(name, "a string")
        setattr(s, name, v)
        found.append(name)
    if len(found) > 1:
        raise HttpError(400, f"set at most one of {', '.join(found)}", param=found[1])


def _common(b: Body, req: OpenAIRequest) -> None:
    n = b.int_("n")
    if n is not None and not 1 <= n <= MAX_N:
        raise HttpError(400, f"n must be in [1, {MAX_N}], got {n}", param="n")
    best_of = b.int_("best_of")
    if best_of is not None and best_of != (n or 1):
        raise HttpError(400, "best_of other than n is not supported", param="best_of")
    req.n = n or 1
    req.stream = bool(b.bool_("stream"))
    opts = b.obj("stream_options")
    if opts is not None:
        if not req.stream:
            raise HttpError(400, "stream_options needs stream=true", param="stream_options")
        req.include_usage = bool(Body(opts).bool_("include_usage"))
    req.user = b.str_("user")
    req.cache_salt = b.str_("cache_salt") or ""


def parse_chat(d: dict[str, Any]) -> OpenAIRequest:
    b = Body(d)
    messages = d.get("messages")
    if not isinstance(messages, list):
        raise HttpError(422, "'messages' must be a list of messages", param="messages")
    if not messages:
        raise HttpError(400, "'messages' is empty: send at least one message", param="messages")
    msgs = [_message(m, i) for i, m in enumerate(messages)]
    req = OpenAIRequest(model=b.str_("model"), inputs=[])
    _common(b, req)
    lp = api_pb2.LogprobOptions()
    req.logprobs = bool(b.bool_("logprobs"))
    top = b.int_("top_logprobs")
    if top is not None:
        if not req.logprobs:
            raise HttpError(400, "top_logprobs needs logprobs=true", param="top_logprobs")
        req.top_logprobs = top
    lp.return_logprob = req.logprobs
    lp.top_logprobs = req.top_logprobs
    gen = b.bool_("add_generation_prompt")
    req.inputs.append(
        GenerateInput(
            messages=msgs,
            add_generation_prompt=True if gen is None else gen,
            sampling=sampling_params(b),
            logprobs=lp,
            stream=req.stream,
            cache_salt=req.cache_salt,
        )
    )
    return req


def _message(m: object, i: int) -> dict[str, str]:
    param = f"messages[{i}]"
    if not isinstance(m, dict) or not isinstance(m.get("role"), str):
        raise HttpError(422, f"{param} must be an object with a string 'role'", param=param)
    content = m.get("content")
    if content is None:
        text = ""
    elif isinstance(content, str):
        text = content
    elif isinstance(content, list):
        parts = []
        for part in content:
            if not isinstance(part, dict) or part.get("type") != "text":
                raise HttpError(400, f"{param}: only text content parts are supported", param=param)
            if not isinstance(part.get("text"), str):
                raise HttpError(422, f"{param}: a text part needs a string 'text'", param=param)
            parts.append(part["text"])
        text = "".join(parts)
    else:
        raise HttpError(422, f"{param}.content must be a string or a list of parts", param=param)
    return {"role": m["role"], "content": text}


def parse_completion(d: dict[str, Any], max_top_logprobs: int) -> OpenAIRequest:
    b = Body(d)
    req = OpenAIRequest(model=b.str_("model"), inputs=[])
    _common(b, req)
    req.echo = bool(b.bool_("echo"))
    top = b.int_("logprobs")
    if top is not None:
        if not 0 <= top <= max_top_logprobs:
            raise HttpError(
                400, f"logprobs must be in [0, {max_top_logprobs}], got {top}", param="logprobs"
            )
        req.logprobs, req.top_logprobs = True, top
    if b.d.get("suffix"):
        raise HttpError(400, "suffix is not supported", param="suffix")
    sampling = sampling_params(b)
    for prompt in _prompts(d.get("prompt")):
        lp = api_pb2.LogprobOptions(return_logprob=req.logprobs, top_logprobs=req.top_logprobs)
        if req.echo and req.logprobs:
            lp.prompt_logprobs_from = 0
        inp = GenerateInput(
            sampling=sampling, logprobs=lp, stream=req.stream, cache_salt=req.cache_salt
        )
        if isinstance(prompt, str):
            inp.text = prompt
        else:
            inp.input_ids = prompt
        req.inputs.append(inp)
    return req


def _prompts(p: object) -> list[str | list[int]]:
    if isinstance(p, str):
        return [p]
    if isinstance(p, list) and p:
        if all(isinstance(x, str) for x in p):
            return list(p)
        if all(_is_int(x) for x in p):
            return [list(p)]
        if all(isinstance(x, list) and x and all(_is_int(y) for y in x) for x in p):
            return [list(x) for x in p]
    raise HttpError(
        422,
        "'prompt' must be a string, a list of strings, a list of token ids or a list of lists "
        "of token ids (non-empty)",
        param="prompt",
    )
