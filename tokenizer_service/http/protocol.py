"""Typed request bodies of the HTTP APIs (pydantic): OpenAI chat and completions, SGLang's
/generate. Types are strict (a string is never a number, a boolean never an integer), a field
sent as null is the same as absent, and any other field a model does not declare is an
explicit 400 naming it (`unsupported_parameter`), so an option this server does not implement
is never silently ignored. `validate` turns pydantic's errors into `HttpError`s: 422 for a
wrong type or a missing field, 400 for a value out of range, with the field as `param`.

Unset fields stay None here; the front door's validation fills them from the one table of
defaults (`radixmesh_wire.step_ops.DEFAULTS`).
"""

from __future__ import annotations

from typing import Any, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from tokenizer_service.http.errors import HttpError

MAX_N = 16  # choices per request: each one is a running request


class Strict(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid", populate_by_name=True)


class StreamOptions(Strict):
    include_usage: bool | None = None
    continuous_usage_stats: Literal[False] | None = None


class JsonSchemaSpec(Strict):
    name: str | None = None
    description: str | None = None
    schema_: dict[str, Any] | None = Field(default=None, alias="schema")
    strict: bool | None = None  # decoding is always constrained: strict either way


class ResponseFormat(Strict):
    type: str
    json_schema: JsonSchemaSpec | None = None


class CommonSampling(Strict):
    """The sampling fields both APIs name alike (OpenAI's, SGLang's and vLLM's)."""

    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    min_p: float | None = None
    seed: int | None = Field(default=None, ge=0)
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    repetition_penalty: float | None = None
    logit_bias: dict[str, float] | None = None
    stop: str | list[str] | None = None
    stop_token_ids: list[int] | None = None
    ignore_eos: bool | None = None
    skip_special_tokens: bool | None = None
    regex: str | None = None
    ebnf: str | None = None
    json_schema: str | dict[str, Any] | None = None


class SamplingFields(CommonSampling):
    """The sampling fields chat and completions share: OpenAI's and the SGLang / vLLM
    extensions."""

    model: str | None = None
    max_tokens: int | None = None
    max_completion_tokens: int | None = None
    min_tokens: int | None = None
    response_format: ResponseFormat | None = None
    n: int | None = Field(default=None, ge=1, le=MAX_N)
    best_of: int | None = None
    stream: bool | None = None
    stream_options: StreamOptions | None = None
    user: str | None = None
    cache_salt: str | None = None  # vLLM's: prefix-cache isolation within the tenant


class ImageUrl(Strict):
    url: str
    detail: str | None = None  # OpenAI's; one resolution is served whatever it says


class TextPart(Strict):
    """A content part: text, or (multimodal models) an `image_url` given as a data URL."""

    type: str
    text: str | None = None
    image_url: ImageUrl | None = None


class FunctionCall(Strict):
    name: str
    arguments: str


class ToolCall(Strict):
    id: str
    type: Literal["function"] = "function"
    function: FunctionCall


class ChatMessage(Strict):
    role: str
    content: str | list[TextPart] | None = None
    name: str | None = None
    tool_calls: list[ToolCall] | None = None  # an assistant turn that called tools
    tool_call_id: str | None = None  # a `tool` turn: the call it answers
    # What an SDK echoes back of an assistant message it received: accepted, unused.
    refusal: str | None = None
    annotations: list[Any] | None = None


class FunctionDef(Strict):
    name: str = Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_.\-]+$")
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class Tool(Strict):
    type: Literal["function"]
    function: FunctionDef


class NamedFunction(Strict):
    name: str


class NamedToolChoice(Strict):
    type: Literal["function"]
    function: NamedFunction


class ChatRequest(SamplingFields):
    messages: list[ChatMessage]
    logprobs: bool | None = None
    top_logprobs: int | None = None
    add_generation_prompt: bool | None = None
    tools: list[Tool] | None = None
    tool_choice: Literal["none", "auto", "required"] | NamedToolChoice | None = None
    parallel_tool_calls: bool | None = None


class CompletionRequest(SamplingFields):
    prompt: str | list[str] | list[int] | list[list[int]]
    logprobs: int | None = None
    echo: bool | None = None
    suffix: str | None = None


class SGLangSampling(CommonSampling):
    """SGLang's sampling_params (its names: max_new_tokens, min_new_tokens)."""

    max_new_tokens: int | None = None
    min_new_tokens: int | None = None
    # Sent by SGLang's clients, no effect here (documented in docs/http.md).
    spaces_between_special_tokens: bool | None = None
    no_stop_trim: bool | None = None
    dtype: str | None = None
    n: Literal[1] | None = None


class SGLangGenerate(Strict):
    text: str | list[str] | None = None
    input_ids: list[int] | list[list[int]] | None = None
    sampling_params: SGLangSampling | None = None
    stream: bool | None = None
    return_logprob: bool | list[bool] | None = None
    logprob_start_len: int | list[int] | None = None
    top_logprobs_num: int | list[int] | None = None
    return_text_in_logprobs: bool | None = None
    rid: str | list[str] | None = None
    stream_options: StreamOptions | None = None  # bench_serving sends it; usage is always in
    # sglang.bench_serving (0.5.23) always sends it, false unless asked: routed experts are a
    # mixture-of-experts feature, so only false is accepted.
    return_routed_experts: Literal[False] | None = None
    # Images (multimodal models): data URLs or base64, one per "<image>" marker of the text;
    # with a batch of texts, one such list per text.
    image_data: str | list[str] | list[list[str]] | None = None


# --- errors ---------------------------------------------------------------------------------

# How to say what a field must be where pydantic's words would name its internal union.
_SHAPES = {
    "stop": "a string or a list of strings",
    "prompt": "a string, a list of strings, a list of token ids or a list of lists of token "
    "ids (non-empty)",
    "stop_token_ids": "a list of integers",
    "logit_bias": "an object of token id -> number",
    "content": "a string or a list of parts",
    "json_schema": "a JSON schema (an object or its text)",
    "messages": "a list of messages",
    "tool_choice": "'none', 'auto', 'required' or {\"type\": \"function\", \"function\": "
    '{"name": ...}}',
    "text": "a string or a list of strings",
    "input_ids": "a list of token ids or a list of such lists",
    "rid": "a string or a list of strings",
}
_WORDS = {
    "string_type": "a string",
    "int_type": "an integer",
    "float_type": "a number",
    "bool_type": "a boolean",
    "dict_type": "an object",
    "list_type": "a list",
    "model_type": "an object",
    "model_attributes_type": "an object",
}
_VALUE_ERRORS = {
    "greater_than",
    "greater_than_equal",
    "less_than",
    "less_than_equal",
    "too_short",
    "too_long",
    "string_too_short",
    "string_too_long",
    "string_pattern_mismatch",
    "literal_error",
}
_MODELS: tuple[type[BaseModel], ...] = (
    StreamOptions,
    JsonSchemaSpec,
    ResponseFormat,
    ChatMessage,
    TextPart,
    ToolCall,
    FunctionCall,
    Tool,
    FunctionDef,
    NamedToolChoice,
    NamedFunction,
    ChatRequest,
    CompletionRequest,
    SGLangSampling,
    SGLangGenerate,
)
_FIELDS = frozenset(
    name for m in _MODELS for name, f in m.model_fields.items() for name in (name, f.alias or name)
)


def _param(loc: tuple[int | str, ...]) -> str:
    """`messages[1].content` from pydantic's location, leaving out union member names and
    dictionary keys (which are not fields)."""
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        elif part in _FIELDS:
            out += f".{part}" if out else part
    return out or str(loc[0])


def _last_field(loc: tuple[int | str, ...]) -> str:
    named = [p for p in loc if isinstance(p, str) and p in _FIELDS]
    return named[-1] if named else ""


def http_error(err: ValidationError) -> HttpError:
    """The first problem of a body, as the API reports it."""
    e = err.errors()[0]
    loc, kind = tuple(e["loc"]), e["type"]
    param = _param(loc)
    if kind == "extra_forbidden":  # the unknown field is the location's last part
        head = _param(loc[:-1]) if len(loc) > 1 else ""
        param = f"{head}.{loc[-1]}" if head else str(loc[-1])
        return HttpError(
            400,
            f"'{param}' is not supported by this server",
            param=param,
            code="unsupported_parameter",
        )
    if kind == "missing":
        return HttpError(422, f"'{param}' is required", param=param, code="missing")
    if kind in _VALUE_ERRORS:
        msg = e["msg"][0].lower() + e["msg"][1:]
        return HttpError(400, f"'{param}': {msg}, got {e['input']!r}", param=param)
    field = _last_field(loc)
    want = _SHAPES.get(field) or _WORDS.get(kind) or e["msg"].lower()
    return HttpError(422, f"'{param}' must be {want}", param=param, code="invalid_type")


def _drop_nulls(body: dict[str, Any]) -> dict[str, Any]:
    """A field sent as null is a field not sent (SDKs echo optional fields as null): at the
    top, in each message and in SGLang's sampling_params; never inside a JSON schema."""
    out = {k: v for k, v in body.items() if v is not None}
    msgs = out.get("messages")
    if isinstance(msgs, list):
        out["messages"] = [
            {k: v for k, v in m.items() if v is not None} if isinstance(m, dict) else m
            for m in msgs
        ]
    sp = out.get("sampling_params")
    if isinstance(sp, dict):
        out["sampling_params"] = {k: v for k, v in sp.items() if v is not None}
    return out


M = TypeVar("M", bound=BaseModel)


def validate(model: type[M], body: dict[str, Any]) -> M:
    try:
        return model.model_validate(_drop_nulls(body))
    except ValidationError as err:
        raise http_error(err) from None
