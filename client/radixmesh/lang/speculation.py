"""API speculative execution (SGLang paper, section 5), for one stream.

With `@function(num_api_spec_tokens=N)`, a gen that finds no speculated text asks the backend
for at least N tokens *without* its stop strings, then keeps only the part up to its first stop
string; the rest is the speculation. Each later constant text appended to the stream is matched
against the speculation's head: on a match it is consumed, on a mismatch the speculation is
dropped. The next gen then takes its value from the speculation (up to its own stop string)
with no call at all, so a program of k short gens separated by template text costs one call
instead of k, and its prompt is sent once instead of k times. Generated text is exactly what
one long generation would have produced, which is why this only suits temperature-0 or
single-sample programs where that is acceptable (as in SGLang).

Invariant: `text` is always a continuation the model produced after the stream's current
prompt; anything appended that does not match it empties it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from radixmesh.lang.backend import Completion
from radixmesh.lang.params import GenParams

Generate = Callable[[GenParams], Completion]


@dataclass
class Speculator:
    num_tokens: int
    text: str = ""

    def fill(self, value: str) -> None:
        """Constant text was appended to the prompt: consume it from the speculation."""
        if self.text.startswith(value):
            self.text = self.text[len(value) :]
        else:
            self.text = ""

    def gen(self, params: GenParams, generate: Generate) -> tuple[str, Completion | None]:
        """The gen's value, and the backend call it made (None when served from speculation).

        Like SGLang, `max_new_tokens` bounds the value in characters when it comes from the
        speculation (the speculation has no token boundaries).
        """
        call: Completion | None = None
        limit = params.max_new_tokens
        if not params.stop:
            if limit is None or len(self.text) < limit:
                call = self._regen(params, generate)
            cut = len(self.text) if limit is None else limit
        else:
            if not self.text:
                call = self._regen(params, generate)
            hits = [p for p in (self.text.find(s) for s in params.stop) if p >= 0]
            if hits:
                cut = min(hits)
            else:
                cut = len(self.text) if limit is None else min(limit, len(self.text))
        value, self.text = self.text[:cut], self.text[cut:]
        return value, call

    def _regen(self, params: GenParams, generate: Generate) -> Completion:
        wider = params.replace(
            max_new_tokens=max(params.max_new_tokens or 0, self.num_tokens), stop=()
        )
        completion = generate(wider)
        self.text = completion.text
        return completion
