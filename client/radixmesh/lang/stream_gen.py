"""How a stream executes a `gen` (a mixin of `StreamExecutor`, kept apart from ordering).

Plain gens go to `backend.generate` (n samples, logprob options: `gen_exec.py`); chat-only
backends get the stream's closed messages (`generate_chat`); with `num_api_spec_tokens` gens
are served from the speculation, or, for chat models, collected per assistant turn and
filled by one call at the role's end (`speculation.py`).

These methods run on the stream's worker, like every op: they may touch the worker-owned
fields declared below (see `interpreter.py` for the invariants).
"""

from __future__ import annotations

import threading
from concurrent.futures import Future
from typing import Any

from radixmesh.lang.backend import Completion, TextCallback
from radixmesh.lang.context import ProgramContext
from radixmesh.lang.errors import ProgramError
from radixmesh.lang.gen_exec import (
    generate_samples,
    meta_for,
    next_token_view,
    wants_next_token_top,
)
from radixmesh.lang.ir import Gen
from radixmesh.lang.params import GenParams
from radixmesh.lang.speculation import Speculator, Term, generate_turn


class GenExecution:
    ctx: ProgramContext
    _cond: threading.Condition
    _text: str
    _meta: dict[str, Any]
    _messages: list[dict[str, str]]
    _role: tuple[str, int] | None
    _spec: Speculator | None
    _turn: list[Term] | None
    _turn_gens: list[tuple[list[Future[Any]], GenParams]]

    def _append(self, text: str, var: str | None = None) -> None:
        raise NotImplementedError

    def _finish_turn(self) -> None:
        """Chat speculation: one call generates the whole assistant turn, which is then split
        along its template (see the speculation module)."""
        assert self._turn is not None and self.ctx.spec_tokens is not None
        terms, gens = self._turn, self._turn_gens
        self._turn, self._turn_gens = None, []
        calls: list[Completion] = []
        if gens:

            def generate(params: GenParams) -> Completion:
                completion: Completion = self.ctx.backend.generate_chat(  # type: ignore[attr-defined]
                    self._messages, params
                )
                self.ctx.stats.add("gen", completion)
                return completion

            try:
                calls = generate_turn(terms, gens[0][1], self.ctx.spec_tokens, generate)
            except ProgramError as err:
                for outputs, _ in gens:
                    for future in outputs:
                        future.set_exception(err)
                raise
        values = iter(gens)
        for term in terms:
            self._append(term.text, term.name)
            if term.name is None:
                continue
            outputs, params = next(values)
            if term.name:  # the turn's call is the first gen's meta; the others are slices
                source = calls[-1] if outputs is gens[0][0] else Completion(term.text)
                with self._cond:
                    self._meta[term.name] = meta_for(self.ctx.backend, source, params)
            for future in outputs:
                future.set_result(term.text)

    def _execute_gen(self, leaf: Gen) -> str | list[str]:
        params = leaf.params.merged_over(self.ctx.defaults)
        prompt, start = self._text, len(self._text)
        chat = getattr(self.ctx.backend, "is_chat_model", False)
        if self._spec is not None and not chat and (params.n or 1) == 1:
            return self._execute_spec_gen(leaf, params)
        probe = wants_next_token_top(params) and not chat  # its one token is never shown
        streams = self.ctx.stream and not probe
        on_text = (lambda chunk: self._append(chunk, leaf.name)) if streams else None
        if chat:
            completions = [self._chat_completion(params, on_text)]
        else:
            completions = generate_samples(
                self.ctx.backend, prompt, params, parallel=self.ctx.parallel, on_text=on_text
            )
        served = completions
        if probe:
            completions = [next_token_view(c) for c in served]
        completion = completions[0]
        with self._cond:
            streamed = self._text[start:]
        if completion.text.startswith(streamed):
            self._append(completion.text[len(streamed) :], leaf.name)
        else:  # the server trimmed streamed text (a stop string): the completion is the truth
            with self._cond:
                self._text = prompt + completion.text
        for c in served:
            self.ctx.stats.add("gen", c)  # as served (a next-token probe did sample one token)
        if leaf.name is not None:
            meta = meta_for(self.ctx.backend, completion, params)
            with self._cond:
                self._meta[leaf.name] = meta
        if params.n is not None and params.n > 1:  # SGLang: the variable lists every sample
            return [c.text for c in completions]
        return completion.text

    def _chat_completion(self, params: GenParams, on_text: TextCallback | None) -> Completion:
        """A chat-only backend generates after the closed messages, so (as in SGLang) a gen
        must come right after `assistant` opens."""
        if self._role is None or self._role[0] != "assistant" or self._text[self._role[1] :]:
            raise ProgramError(
                "with a chat model, gen must come right after the assistant role opens "
                "(e.g. s += rm.assistant(rm.gen('answer')))"
            )
        if (params.n or 1) > 1:
            raise ProgramError("gen(n=...) > 1 is not supported with a chat model")
        result: Completion = self.ctx.backend.generate_chat(  # type: ignore[attr-defined]
            self._messages, params, on_text=on_text
        )
        return result

    def _execute_spec_gen(self, leaf: Gen, params: GenParams) -> str:
        assert self._spec is not None
        prompt = self._text

        def generate(wider: GenParams) -> Completion:
            return self.ctx.backend.generate(prompt, wider)

        value, call = self._spec.gen(params, generate)
        self._append(value, leaf.name)
        if call is not None:
            self.ctx.stats.add("gen", call)
        if leaf.name is not None:
            source = call or Completion(value, finish_reason="stop")
            with self._cond:
                self._meta[leaf.name] = meta_for(self.ctx.backend, source, params)
        return value
