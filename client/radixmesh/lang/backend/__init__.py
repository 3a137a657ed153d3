"""The backend contract: what the interpreter needs from a model server.

A backend is synchronous and thread-safe: the interpreter calls it from many stream threads
at once, and each call is one independent request (no hidden per-backend conversation).

Invariants the interpreter relies on:
- `generate(prompt, params)` with `params.max_new_tokens == 0` only prefills and caches the
  prompt (the frontend hint) and returns empty text.
- `prompt_logprobs[k]` of a `Completion` is the logprob of prompt token
  `prompt_logprobs_from + k` given all tokens before it; position 0 has no context and is
  never scored.
- `tokenize(text)` (with `add_special_tokens=True`) yields exactly the ids that
  `generate(text, ...)` prefills, so positions computed from it match the server's.

SGLang's module paths are mirrored by the submodules `base_backend` (`BaseBackend`),
`runtime_endpoint` (`RuntimeEndpoint`) and `openai` (`OpenAI`).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from radixmesh.lang.params import GenParams

#: A prompt is text, or token ids sent as they are.
Prompt = str | Sequence[int]
TextCallback = Callable[[str], None]


@dataclass(frozen=True)
class TokenLogprob:
    """Logprob of one token; `top` holds (token_id, logprob) alternatives, best first."""

    token_id: int
    logprob: float
    top: tuple[tuple[int, float], ...] = ()


@dataclass(frozen=True)
class LogprobRequest:
    """What logprobs to return. `prompt_logprobs_from=None` means no prompt logprobs."""

    prompt_logprobs_from: int | None = None
    top_logprobs: int = 0
    return_logprob: bool = False


@dataclass(frozen=True)
class Completion:
    """The outcome of one request, including the radix-cache accounting of its prompt."""

    text: str
    output_ids: tuple[int, ...] = ()
    finish_reason: str = "stop"
    matched_stop: str = ""
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int = 0
    output_logprobs: tuple[TokenLogprob, ...] = ()
    prompt_logprobs: tuple[TokenLogprob, ...] = ()
    prompt_logprobs_from: int = 0
    request_id: str = ""
    # (token_id, logprob) alternatives of the next token after the prompt, best first: set
    # only for a `gen(max_tokens=0, top_logprobs_num=k)` (see `gen_exec.next_token_probe`).
    next_token_top: tuple[tuple[int, float], ...] = ()

    @property
    def cache_hit_rate(self) -> float:
        return self.cached_tokens / self.prompt_tokens if self.prompt_tokens else 0.0


class TokenUsage:
    """SGLang's `backend.token_usage`: prompt and completion tokens of every request the
    programs run on this backend have made (gens, speculative calls, select scoring, prefix
    warm-ups), as the server counted them. Thread-safe; `reset()` starts over."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.prompt_tokens = 0
        self.completion_tokens = 0

    def add(self, completion: Completion) -> None:
        with self._lock:
            self.prompt_tokens += completion.prompt_tokens
            self.completion_tokens += completion.completion_tokens

    def reset(self) -> None:
        with self._lock:
            self.prompt_tokens = self.completion_tokens = 0

    def __repr__(self) -> str:
        return (
            f"TokenUsage(prompt_tokens={self.prompt_tokens}, "
            f"completion_tokens={self.completion_tokens})"
        )


@dataclass(frozen=True)
class RoleMarkers:
    prefix: str
    suffix: str


@dataclass(frozen=True)
class ModelInfo:
    """What the client needs to render chat roles without transformers.

    A chat prompt is: [system markers around default_system_prompt when the program starts
    with a non-system role] + for each message prefix[role] + content + suffix[role].
    `bos_token_id` is None when the model has none.
    """

    model_name: str = ""
    roles: Mapping[str, RoleMarkers] = field(default_factory=dict)
    default_system_prompt: str = ""
    generation_prefix: str = ""
    eos_token_ids: tuple[int, ...] = ()
    bos_token_id: int | None = None
    context_length: int = 0
    vocab_size: int = 0


@runtime_checkable
class Backend(Protocol):
    """A model server as the DSL sees it (see the module docstring for invariants)."""

    def generate(
        self,
        prompt: Prompt,
        params: GenParams,
        *,
        logprobs: LogprobRequest | None = None,
        on_text: TextCallback | None = None,
    ) -> Completion:
        """Run one request; `on_text` (if given) receives text chunks as they stream."""
        ...

    def warm(self, prompt: Prompt) -> Completion:
        """Prefill and cache `prompt` only (max_new_tokens = 0): the frontend hint."""
        ...

    def prompt_logprobs(self, prompt: Prompt, start: int, *, top: int = 0) -> Completion:
        """Prefill only, returning logprobs of prompt tokens from position `start` on."""
        ...

    def tokenize(self, text: str, *, add_special_tokens: bool = True) -> list[int]: ...

    def model_info(self) -> ModelInfo: ...

    def close(self) -> None: ...


class BackendBase:
    """Implements `warm` and `prompt_logprobs` in terms of `generate`; holds `token_usage`."""

    @property
    def token_usage(self) -> TokenUsage:
        """Created on first use (subclasses need not call an __init__ here); the dict's
        setdefault is atomic, so concurrent first reads share one object."""
        usage: TokenUsage = self.__dict__.setdefault("_token_usage", TokenUsage())
        return usage

    def generate(
        self,
        prompt: Prompt,
        params: GenParams,
        *,
        logprobs: LogprobRequest | None = None,
        on_text: TextCallback | None = None,
    ) -> Completion:
        raise NotImplementedError

    def warm(self, prompt: Prompt) -> Completion:
        return self.generate(prompt, GenParams(max_new_tokens=0))

    def prompt_logprobs(self, prompt: Prompt, start: int, *, top: int = 0) -> Completion:
        request = LogprobRequest(prompt_logprobs_from=start, top_logprobs=top)
        return self.generate(prompt, GenParams(max_new_tokens=0), logprobs=request)

    def get_chat_template(self) -> Any:
        """SGLang's `backend.get_chat_template()` (a `ChatTemplate` of this model's markers)."""
        from radixmesh.lang.chat_template import ChatTemplate

        return ChatTemplate.from_model_info(self.model_info())  # type: ignore[attr-defined]

    def close(self) -> None:
        return None


#: SGLang's name for the backend base class (also at `radixmesh.lang.backend.base_backend`).
BaseBackend = BackendBase
