"""`rm.OpenAI(...)`: the DSL over any OpenAI-compatible HTTP API (stdlib only, no `openai`).

Completion models (`is_chat_model=False`) get the program's prompt text on
`POST {base_url}/completions`; that is what API speculative execution needs
(`@function(num_api_spec_tokens=N)`, see `speculation.py`). Chat models get the program's
closed messages on `POST {base_url}/chat/completions`; as in SGLang, a gen must then come
right after `assistant` opens. Usage (`prompt_tokens`, `completion_tokens`,
`prompt_tokens_details.cached_tokens`) fills each Completion, so `state.stats` counts what was
sent. Sampling knobs beyond OpenAI's (`top_k`, `min_p`, `regex`, `json_schema`, `ebnf`, ...)
are sent under SGLang's names, which SGLang- and RadixMesh-style servers accept.

Not available over this API: prompt logprobs and tokenization, so `select` raises a
BackendError (score choices with `rm.RuntimeEndpoint` instead); `warm` (the frontend hint)
sends nothing, since a hosted API caches (or not) on its own.
"""

from __future__ import annotations

import json
import os
import urllib.error
import urllib.request
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

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
from radixmesh.lang.errors import BackendError
from radixmesh.lang.params import GenParams

DEFAULT_BASE_URL = "https://api.openai.com/v1"

#: SGLang's "default" template, used to render roles into a completion model's prompt.
PLAIN_ROLES = ModelInfo(
    model_name="openai-completion",
    roles={
        "system": RoleMarkers("SYSTEM:", "\n"),
        "user": RoleMarkers("USER:", "\n"),
        "assistant": RoleMarkers("ASSISTANT:", "\n"),
    },
)

_EXTRAS = ("top_k", "min_p", "seed", "ignore_eos", "regex", "json_schema", "ebnf")


def request_body(params: GenParams, logprobs: LogprobRequest | None) -> dict[str, Any]:
    """The sampling part of a completions / chat request; unset knobs are left out."""
    body: dict[str, Any] = {}
    if params.max_new_tokens is not None:
        body["max_tokens"] = params.max_new_tokens
    if params.min_new_tokens is not None:
        body["min_tokens"] = params.min_new_tokens
    if params.stop:
        body["stop"] = list(params.stop)
    if params.stop_token_ids:
        body["stop_token_ids"] = list(params.stop_token_ids)
    for name in ("temperature", "top_p", *_EXTRAS):
        value = getattr(params, name)
        if value is not None:
            body[name] = value
    if logprobs is not None and logprobs.return_logprob:
        body["logprobs"] = logprobs.top_logprobs
    return body


def _usage(msg: Mapping[str, Any]) -> tuple[int, int, int]:
    usage = msg.get("usage") or {}
    details = usage.get("prompt_tokens_details") or {}
    return (
        int(usage.get("prompt_tokens") or 0),
        int(usage.get("completion_tokens") or 0),
        int(details.get("cached_tokens") or 0),
    )


def _output_logprobs(choice: Mapping[str, Any]) -> tuple[TokenLogprob, ...]:
    """OpenAI's completion logprobs carry token text, not ids: ids are reported as -1."""
    lp = choice.get("logprobs") or {}
    values = lp.get("token_logprobs") or []
    return tuple(TokenLogprob(-1, float(v)) for v in values if v is not None)


class OpenAIBackend(BackendBase):
    """See the module docstring. `api_key` defaults to `$OPENAI_API_KEY`, `base_url` to
    `$OPENAI_BASE_URL` or OpenAI's; `timeout` (seconds) bounds every request."""

    def __init__(
        self,
        model_name: str,
        base_url: str | None = None,
        api_key: str | None = None,
        *,
        is_chat_model: bool | None = None,
        timeout: float | None = 120.0,
        chat_template: ModelInfo | None = None,
    ) -> None:
        self.model_name = model_name
        self.base_url = (base_url or os.environ.get("OPENAI_BASE_URL") or DEFAULT_BASE_URL).rstrip(
            "/"
        )
        self.api_key = api_key if api_key is not None else os.environ.get("OPENAI_API_KEY", "")
        # SGLang's rule: OpenAI's models are chat models except the "-instruct" completion one.
        self.is_chat_model = (
            is_chat_model if is_chat_model is not None else not model_name.endswith("-instruct")
        )
        self.timeout = timeout
        self._info = chat_template or PLAIN_ROLES

    # ---- HTTP ---------------------------------------------------------------------------

    def _post(self, path: str, body: Mapping[str, Any]) -> Any:
        request = urllib.request.Request(
            self.base_url + path,
            data=json.dumps(body).encode(),
            headers={"Content-Type": "application/json", "Authorization": f"Bearer {self.api_key}"},
            method="POST",
        )
        try:
            return urllib.request.urlopen(request, timeout=self.timeout)
        except urllib.error.HTTPError as exc:
            detail = exc.read().decode(errors="replace")[:500]
            raise BackendError(
                f"POST {path} failed: HTTP {exc.code}: {detail}", code=f"HTTP_{exc.code}"
            ) from exc
        except (urllib.error.URLError, OSError) as exc:
            raise BackendError(
                f"POST {self.base_url}{path} failed: {exc}", code="UNAVAILABLE"
            ) from exc

    def _call(self, path: str, body: dict[str, Any], on_text: TextCallback | None) -> Completion:
        """One request; streamed (server-sent events) when `on_text` is given."""
        if on_text is None:
            with self._post(path, body) as response:
                return self._complete(json.loads(response.read()), chat=path.startswith("/chat"))
        body = {**body, "stream": True, "stream_options": {"include_usage": True}}
        text: list[str] = []
        finish, usage_msg = "", {}
        with self._post(path, body) as response:
            for event in _events(response):
                for choice in event.get("choices") or []:
                    chunk = (
                        (choice.get("delta") or {}).get("content")
                        if path.startswith("/chat")
                        else choice.get("text")
                    )
                    if chunk:
                        text.append(chunk)
                        on_text(chunk)
                    finish = choice.get("finish_reason") or finish
                if event.get("usage"):
                    usage_msg = event
        prompt, completion, cached = _usage(usage_msg)
        return Completion(
            "".join(text),
            finish_reason=finish or "stop",
            prompt_tokens=prompt,
            completion_tokens=completion,
            cached_tokens=cached,
        )

    @staticmethod
    def _complete(msg: Mapping[str, Any], *, chat: bool) -> Completion:
        choices = msg.get("choices") or []
        if not choices:
            raise BackendError(f"the response has no choices: {json.dumps(msg)[:300]}")
        choice = choices[0]
        text = (choice.get("message") or {}).get("content") if chat else choice.get("text")
        prompt, completion, cached = _usage(msg)
        return Completion(
            text or "",
            finish_reason=choice.get("finish_reason") or "stop",
            prompt_tokens=prompt,
            completion_tokens=completion,
            cached_tokens=cached,
            output_logprobs=() if chat else _output_logprobs(choice),
            request_id=str(msg.get("id", "")),
        )

    # ---- the Backend contract -----------------------------------------------------------

    def generate(
        self,
        prompt: Prompt,
        params: GenParams,
        *,
        logprobs: LogprobRequest | None = None,
        on_text: TextCallback | None = None,
    ) -> Completion:
        if params.max_new_tokens == 0:
            return self.warm(prompt)
        if logprobs is not None and logprobs.prompt_logprobs_from is not None:
            raise BackendError("prompt logprobs are not available over the OpenAI API")
        if self.is_chat_model:
            raise BackendError(
                f"{self.model_name} is a chat model: the DSL sends it messages (generate_chat)"
            )
        if not isinstance(prompt, str):
            raise BackendError("the OpenAI API takes text prompts, not token ids")
        body = {"model": self.model_name, "prompt": prompt, **request_body(params, logprobs)}
        return self._call("/completions", body, on_text)

    def generate_chat(
        self,
        messages: Sequence[Mapping[str, str]],
        params: GenParams,
        *,
        on_text: TextCallback | None = None,
    ) -> Completion:
        """A chat completion after `messages` (the program's closed messages)."""
        body = {
            "model": self.model_name,
            "messages": [dict(m) for m in messages],
            **request_body(params, None),
        }
        return self._call("/chat/completions", body, on_text)

    def warm(self, prompt: Prompt) -> Completion:
        return Completion("")  # nothing to send: see the module docstring

    def prompt_logprobs(self, prompt: Prompt, start: int, *, top: int = 0) -> Completion:
        raise BackendError(
            "select needs prompt logprobs, which the OpenAI API does not return; "
            "run select against rm.RuntimeEndpoint"
        )

    def tokenize(self, text: str, *, add_special_tokens: bool = True) -> list[int]:
        raise BackendError(
            "the OpenAI API has no tokenizer endpoint (select needs prompt logprobs and "
            "token counts: run select against rm.RuntimeEndpoint)"
        )

    def model_info(self) -> ModelInfo:
        return self._info

    def __repr__(self) -> str:
        return f"OpenAIBackend({self.model_name!r}, {self.base_url!r})"


def _events(response: Any) -> Iterator[dict[str, Any]]:
    """The JSON payloads of a server-sent event stream, up to `data: [DONE]`."""
    for raw in response:
        line = raw.decode().strip()
        if not line.startswith("data:"):
            continue
        data = line[5:].strip()
        if data == "[DONE]":
            return
        yield json.loads(data)


def OpenAI(  # noqa: N802 - SGLang's spelling
    model_name: str,
    base_url: str | None = None,
    api_key: str | None = None,
    *,
    is_chat_model: bool | None = None,
    timeout: float | None = 120.0,
) -> OpenAIBackend:
    """SGLang-style constructor: `rm.set_default_backend(rm.OpenAI("gpt-4o-mini"))`, or
    `rm.OpenAI("model", base_url="http://host:port/v1", is_chat_model=False)`."""
    return OpenAIBackend(
        model_name, base_url, api_key, is_chat_model=is_chat_model, timeout=timeout
    )
