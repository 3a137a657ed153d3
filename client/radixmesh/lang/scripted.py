"""`ScriptedBackend`: an in-memory, deterministic backend for tests and offline examples.

Tokens are whitespace-prefixed words (`" world"`), numbered in order of first sight, so
prompts, positions and cache matches are easy to reason about in tests. It keeps a prefix
cache of every prompt + output it has seen, reporting `cached_tokens` like the scheduler
(at most `prompt_logprobs_from - 1` when prompt logprobs are asked, since the logits scoring
token p come from position p - 1, and at least one prompt token is computed when
generating). Every call is recorded in `calls` (start order) and
`on_call` runs (outside any lock) at the start of each generate, where tests can block on
Events or Barriers to prove or forbid overlap; `max_inflight` is the most calls seen at once.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

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
from radixmesh.lang.params import GenParams

_TOKEN = re.compile(r"\s*\S+|\s+")

#: (prompt text, params) -> the model's output before stop strings / max tokens apply.
Responder = Callable[[str, GenParams], str]
#: (context tokens, token) -> logprob of token after context.
LogprobFn = Callable[[Sequence[str], str], float]
#: context tokens -> the argmax next token.
TopFn = Callable[[Sequence[str]], str]

_Trie = dict[int, "_Trie"]

CHATML = ModelInfo(
    model_name="scripted-chatml",
    roles={
        "system": RoleMarkers("<|im_start|>system\n", "<|im_end|>\n"),
        "user": RoleMarkers("<|im_start|>user\n", "<|im_end|>\n"),
        "assistant": RoleMarkers("<|im_start|>assistant\n", "<|im_end|>\n"),
    },
    generation_prefix="<|im_start|>assistant\n",
    eos_token_ids=(0,),
)


@dataclass(frozen=True)
class Call:
    """One recorded request. kind: "gen", "warm" (max_new_tokens=0) or "score"."""

    seq: int
    kind: str
    prompt: str
    params: GenParams
    logprobs_from: int | None


class ScriptedBackend(BackendBase):
    def __init__(
        self,
        respond: Responder | Mapping[str, str] | None = None,
        *,
        logprob: LogprobFn | None = None,
        top: TopFn | None = None,
        info: ModelInfo = CHATML,
        on_call: Callable[[Call], None] | None = None,
    ) -> None:
        """`respond` as a mapping: the value of the longest key the prompt ends with
        ("" as a key is the fallback). Default output: "ok". Default logprob: -1.0."""
        self._respond = respond
        self._logprob: LogprobFn = logprob or (lambda _context, _token: -1.0)
        self._top = top
        self._info = info
        self.on_call = on_call
        self._lock = threading.Lock()
        self._vocab: dict[str, int] = {"<eos>": 0}
        self._words: list[str] = ["<eos>"]
        self._cache: _Trie = {}
        self.calls: list[Call] = []
        self.inflight = 0
        self.max_inflight = 0

    # ---- tokens -------------------------------------------------------------------------

    def _id(self, token: str) -> int:
        with self._lock:
            if token not in self._vocab:
                self._vocab[token] = len(self._words)
                self._words.append(token)
            return self._vocab[token]

    def tokenize(self, text: str, *, add_special_tokens: bool = True) -> list[int]:
        return [self._id(t) for t in _TOKEN.findall(text)]

    def detokenize(self, ids: Sequence[int]) -> str:
        with self._lock:
            return "".join(self._words[i] for i in ids if i != 0)

    def _tokens(self, ids: Sequence[int]) -> list[str]:
        with self._lock:
            return [self._words[i] for i in ids]

    # ---- cache ----------------------------------------------------------------------------

    def _match(self, ids: Sequence[int]) -> int:
        with self._lock:
            node, n = self._cache, 0
            for i in ids:
                nxt = node.get(i)
                if nxt is None:
                    break
                node, n = nxt, n + 1
            return n

    def _insert(self, ids: Sequence[int]) -> None:
        with self._lock:
            node = self._cache
            for i in ids:
                node = node.setdefault(i, {})

    # ---- requests -------------------------------------------------------------------------

    def _output(self, text: str, params: GenParams) -> str:
        if callable(self._respond):
            return self._respond(text, params)
        if self._respond is None:
            return "ok"
        keys = [k for k in self._respond if text.endswith(k)]
        if not keys:
            raise KeyError(f"no scripted response for prompt ending {text[-40:]!r}")
        return self._respond[max(keys, key=len)]

    def generate(
        self,
        prompt: Prompt,
        params: GenParams,
        *,
        logprobs: LogprobRequest | None = None,
        on_text: TextCallback | None = None,
    ) -> Completion:
        text = prompt if isinstance(prompt, str) else self.detokenize(prompt)
        start = logprobs.prompt_logprobs_from if logprobs else None
        kind = "score" if start is not None else "warm" if params.max_new_tokens == 0 else "gen"
        with self._lock:
            call = Call(len(self.calls), kind, text, params, start)
            self.calls.append(call)
            self.inflight += 1
            self.max_inflight = max(self.max_inflight, self.inflight)
        try:
            if self.on_call is not None:
                self.on_call(call)
            return self._complete(prompt, text, params, logprobs, on_text)
        finally:
            with self._lock:
                self.inflight -= 1

    def _complete(
        self,
        prompt: Prompt,
        text: str,
        params: GenParams,
        logprobs: LogprobRequest | None,
        on_text: TextCallback | None,
    ) -> Completion:
        ids = self.tokenize(text) if isinstance(prompt, str) else list(prompt)
        limit = len(ids) if params.max_new_tokens == 0 else len(ids) - 1
        start = logprobs.prompt_logprobs_from if logprobs else None
        if start is not None:  # the logits scoring token `start` come from token start - 1
            limit = min(limit, start - 1)
        cached = min(self._match(ids), max(limit, 0))
        out, matched = "", ""
        if params.max_new_tokens != 0:
            out = self._output(text, params)
            for stop in params.stop:
                cut = out.find(stop)
                if cut >= 0 and (not matched or cut < out.find(matched)):
                    matched = stop
            if matched:
                out = out[: out.find(matched)]
        out_ids = self.tokenize(out)
        finish = "stop"
        if params.max_new_tokens is not None and len(out_ids) > params.max_new_tokens:
            out_ids = out_ids[: params.max_new_tokens]
            out, finish = self.detokenize(out_ids), "length"
        if on_text is not None:
            for token in self._tokens(out_ids):
                on_text(token)
        self._insert(ids + out_ids)
        prompt_lp: list[TokenLogprob] = []
        first = 0
        if start is not None:
            first = max(start, 1)
            words = self._tokens(ids)
            for pos in range(first, len(ids)):
                lp = self._logprob(words[:pos], words[pos])
                top: tuple[tuple[int, float], ...] = ()
                if logprobs is not None and logprobs.top_logprobs and self._top is not None:
                    best = self._top(words[:pos])
                    top = ((self._id(best), self._logprob(words[:pos], best)),)
                prompt_lp.append(TokenLogprob(ids[pos], lp, top))
        return Completion(
            text=out,
            output_ids=tuple(out_ids),
            finish_reason=finish,
            matched_stop=matched,
            prompt_tokens=len(ids),
            completion_tokens=len(out_ids),
            cached_tokens=cached,
            prompt_logprobs=tuple(prompt_lp),
            prompt_logprobs_from=first,
        )

    def model_info(self) -> ModelInfo:
        return self._info

    def calls_of(self, kind: str) -> list[Call]:
        with self._lock:
            return [c for c in self.calls if c.kind == kind]
