"""OpenAI request bodies -> the core's GenerateInput (chat and completions), over the typed
models of `protocol.py`: types and unknown fields are checked there (422 / 400 naming the
field); this module checks what crosses fields (one grammar at most, best_of = n,
stream_options needs stream) and fills the public wire's `SamplingParams`. Ranges the gRPC API
shares (temperature, max_tokens against the context, ...) are the core's validation; the
OpenAI handler renames its field names to OpenAI's (`openai_field`).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from radixmesh_wire.pb import api_pb2
from tokenizer_service.core import GenerateError, GenerateInput
from tokenizer_service.http.errors import HttpError, from_status
from tokenizer_service.http.image_parts import MARKER, image_bytes
from tokenizer_service.http.protocol import (
    MAX_N,
    ChatMessage,
    ChatRequest,
    CompletionRequest,
    SamplingFields,
    SGLangSampling,
    validate,
)
from tokenizer_service.http.tools import ToolPlan

__all__ = ["MAX_N", "OpenAIRequest", "parse_chat", "parse_completion", "sampling_params"]

# The core's (gRPC API's) names of sampling fields -> OpenAI's, for its error messages.
OPENAI_NAMES = {"max_new_tokens": "max_tokens", "min_new_tokens": "min_tokens"}


def openai_field(message: str, field_name: str) -> tuple[str, str | None]:
    """A core validation message and its field, in OpenAI's names."""
    for ours, theirs in OPENAI_NAMES.items():
        message = message.replace(ours, theirs)
    return message, OPENAI_NAMES.get(field_name, field_name) or None


def openai_error(exc: GenerateError) -> HttpError:
    """A core error in OpenAI's words: `max_tokens`, not the gRPC API's `max_new_tokens`, and
    the field at fault as `param`."""
    message, param = openai_field(exc.message, exc.field)
    return from_status(exc.status, message, param)


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
    chat: ChatRequest | None = None  # the typed body of a chat request (tools, tool_choice)
    tools: ToolPlan | None = None  # a chat's tool plan (openai.OpenAIApi._tools)


_NUMBERS = (
    "temperature",
    "top_p",
    "top_k",
    "min_p",
    "seed",
    "presence_penalty",
    "frequency_penalty",
    "repetition_penalty",
)


def sampling_params(b: SamplingFields | SGLangSampling) -> api_pb2.SamplingParams:
    """The public wire's sampling message of a typed body; unset fields stay unset (the
    validation fills them from the defaults table)."""
    s = api_pb2.SamplingParams(skip_special_tokens=True)
    if isinstance(b, SGLangSampling):
        max_tokens, min_tokens = b.max_new_tokens, b.min_new_tokens
    else:
        max_tokens = b.max_completion_tokens
        max_tokens = b.max_tokens if max_tokens is None else max_tokens
        min_tokens = b.min_tokens
    if max_tokens is not None:
        s.max_new_tokens = max_tokens
    if min_tokens is not None:
        s.min_new_tokens = min_tokens
    for name in _NUMBERS:
        v = getattr(b, name)
        if v is not None:
            setattr(s, name, v)
    for flag in ("ignore_eos", "skip_special_tokens"):
        if getattr(b, flag) is not None:
            setattr(s, flag, getattr(b, flag))
    stop = [b.stop] if isinstance(b.stop, str) else (b.stop or [])
    s.stop.extend(x for x in stop if x)
    s.stop_token_ids.extend(b.stop_token_ids or [])
    for k, v in (b.logit_bias or {}).items():
        try:
            s.logit_bias[int(k)] = v
        except ValueError as exc:
            raise HttpError(
                400, f"logit_bias key {k!r} is not a token id", param="logit_bias"
            ) from exc
    _constraint(b, s)
    return s


def _constraint(b: SamplingFields | SGLangSampling, s: api_pb2.SamplingParams) -> None:
    found: list[str] = []
    rf = b.response_format if isinstance(b, SamplingFields) else None
    if rf is not None:
        if rf.type == "json_object":
            s.json_schema = json.dumps({"type": "object"})
            found.append("response_format")
        elif rf.type == "json_schema":
            if rf.json_schema is None or rf.json_schema.schema_ is None:
                raise HttpError(
                    400,
                    "response_format json_schema needs json_schema.schema (an object)",
                    param="response_format",
                )
            # Decoding is always constrained to the schema, so strict=false is served strictly.
            s.json_schema = json.dumps(rf.json_schema.schema_)
            found.append("response_format")
        elif rf.type != "text":
            raise HttpError(
                400,
                f"response_format type {rf.type!r} is not one of text, json_object, json_schema",
                param="response_format",
            )
    for name in ("regex", "ebnf", "json_schema"):
        v = getattr(b, name)
        if v is None:
            continue
        setattr(s, name, v if isinstance(v, str) else json.dumps(v))
        found.append(name)
    if len(found) > 1:
        raise HttpError(400, f"set at most one of {', '.join(found)}", param=found[1])


def _common(b: SamplingFields, req: OpenAIRequest) -> None:
    n = b.n or 1
    if b.best_of is not None and b.best_of != n:
        raise HttpError(400, "best_of other than n is not supported", param="best_of")
    req.n = n
    req.stream = bool(b.stream)
    if b.stream_options is not None:
        if not req.stream:
            raise HttpError(400, "stream_options needs stream=true", param="stream_options")
        req.include_usage = bool(b.stream_options.include_usage)
    req.user = b.user
    req.cache_salt = b.cache_salt or ""


def parse_chat(d: dict[str, Any]) -> OpenAIRequest:
    b = validate(ChatRequest, d)
    if not b.messages:
        raise HttpError(400, "'messages' is empty: send at least one message", param="messages")
    images: list[bytes] = []
    msgs = [message_dict(m, i, images) for i, m in enumerate(b.messages)]
    req = OpenAIRequest(model=b.model, inputs=[], chat=b)
    _common(b, req)
    req.logprobs = bool(b.logprobs)
    if b.top_logprobs is not None:
        if not req.logprobs:
            raise HttpError(400, "top_logprobs needs logprobs=true", param="top_logprobs")
        req.top_logprobs = b.top_logprobs
    lp = api_pb2.LogprobOptions(return_logprob=req.logprobs, top_logprobs=req.top_logprobs)
    req.inputs.append(
        GenerateInput(
            messages=msgs,
            add_generation_prompt=True
            if b.add_generation_prompt is None
            else b.add_generation_prompt,
            sampling=sampling_params(b),
            logprobs=lp,
            stream=req.stream,
            cache_salt=req.cache_salt,
            images=images,
        )
    )
    return req


def message_dict(m: ChatMessage, i: int, images: list[bytes] | None = None) -> dict[str, Any]:
    """A chat message as the chat template reads it: text content joined from its parts (an
    `image_url` part becomes the image marker there, its bytes appended to `images`); an
    assistant's tool calls and a tool result's call id kept for templates that render them."""
    param = f"messages[{i}]"
    if isinstance(m.content, list):
        parts = []
        for j, part in enumerate(m.content):
            if part.type == "image_url" and images is not None:
                if part.image_url is None:
                    raise HttpError(
                        400, f"{param}: an image_url part needs 'image_url'", param=param
                    )
                where = f"{param}.content[{j}].image_url.url"
                images.append(image_bytes(part.image_url.url, where))
                parts.append(MARKER)
                continue
            if part.type != "text":
                raise HttpError(
                    400,
                    f"{param}: only text and image_url content parts are supported, "
                    f"not {part.type!r}",
                    param=f"{param}.content",
                )
            if part.text is None:
                raise HttpError(422, f"{param}: a text part needs a string 'text'", param=param)
            parts.append(part.text)
        text = "".join(parts)
    else:
        text = m.content or ""
    out: dict[str, Any] = {"role": m.role, "content": text}
    if m.name is not None:
        out["name"] = m.name
    if m.tool_calls:
        out["tool_calls"] = [
            {
                "id": c.id,
                "type": "function",
                "function": {"name": c.function.name, "arguments": _arguments(c.function)},
            }
            for c in m.tool_calls
        ]
    if m.tool_call_id is not None:
        out["tool_call_id"] = m.tool_call_id
    return out


def _arguments(f: Any) -> Any:
    """Templates render a call's arguments as an object (Qwen's, Llama's `tojson`); the API
    sends them as JSON text. Text that is not JSON stays text."""
    try:
        return json.loads(f.arguments)
    except ValueError:
        return f.arguments


def parse_completion(d: dict[str, Any], max_top_logprobs: int) -> OpenAIRequest:
    b = validate(CompletionRequest, d)
    req = OpenAIRequest(model=b.model, inputs=[])
    _common(b, req)
    req.echo = bool(b.echo)
    if b.logprobs is not None:
        top = b.logprobs
        if not 0 <= top <= max_top_logprobs:
            raise HttpError(
                400, f"logprobs must be in [0, {max_top_logprobs}], got {top}", param="logprobs"
            )
        req.logprobs, req.top_logprobs = True, top
    if b.suffix:
        raise HttpError(400, "suffix is not supported", param="suffix")
    sampling = sampling_params(b)
    for prompt in _prompts(b.prompt):
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


def _prompts(p: str | list[str] | list[int] | list[list[int]]) -> list[str | list[int]]:
    if isinstance(p, str):
        return [p]
    if p and all(isinstance(x, str) for x in p):
        return [x for x in p if isinstance(x, str)]
    if p and all(isinstance(x, int) for x in p):
        return [[x for x in p if isinstance(x, int)]]
    if p and all(isinstance(x, list) and x for x in p):
        return [list(x) for x in p if isinstance(x, list)]
    raise HttpError(
        422,
        "'prompt' must be a string, a list of strings, a list of token ids or a list of lists "
        "of token ids (non-empty)",
        param="prompt",
    )
