"""How `select` picks a choice from per-token logprobs (pure arithmetic, no I/O).

For every choice the scorer (`scoring.py`) provides a `ChoiceScores`: the logprob of each of
the choice's tokens given the prompt, whether each token was the model's argmax (when the
server returned top-1 alternatives), and, for `unconditional_normalized`, the logprobs of
the same choice after a neutral context.

Invariants: every method returns one score per choice and the index of the best one; ties go
to the earliest choice (stable, so results never depend on thread timing).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol


@dataclass(frozen=True)
class ChoiceScores:
    token_logprobs: tuple[float, ...]
    is_argmax: tuple[bool, ...] | None = None
    unconditional_logprobs: tuple[float, ...] | None = None

    @property
    def mean(self) -> float:
        return sum(self.token_logprobs) / len(self.token_logprobs)


class ChoicesMethod(Protocol):
    """A select rule. `needs_top`: ask for top-1 prompt alternatives; `needs_unconditional`:
    also score each choice after the neutral `context` (None = the model's BOS/EOS token)."""

    @property
    def name(self) -> str: ...
    @property
    def needs_top(self) -> bool: ...
    @property
    def needs_unconditional(self) -> bool: ...
    @property
    def context(self) -> str | None: ...

    def pick(self, scores: Sequence[ChoiceScores]) -> tuple[int, list[float]]: ...


def _argmax(values: Sequence[float]) -> int:
    best = 0
    for i, v in enumerate(values):
        if v > values[best]:
            best = i
    return best


@dataclass(frozen=True)
class TokenLengthNormalized:
    """Mean logprob per token of the choice (the default): long choices are not penalised."""

    name: str = "token_length_normalized"
    needs_top: bool = False
    needs_unconditional: bool = False
    context: str | None = None

    def pick(self, scores: Sequence[ChoiceScores]) -> tuple[int, list[float]]:
        values = [s.mean for s in scores]
        return _argmax(values), values


@dataclass(frozen=True)
class GreedyToken:
    """The choice a greedy decoder agrees with longest.

    Score = number of leading choice tokens that were the argmax at their position; ties
    are broken by the mean logprob. Without top-1 data from the server, falls back to a
    lexicographic comparison of the per-token logprobs (the first token decides, the next
    breaks ties, ...; a shared token run falls to the mean), which agrees with greedy
    decoding whenever the choices diverge at a token.
    """

    name: str = "greedy_token"
    needs_top: bool = True
    needs_unconditional: bool = False
    context: str | None = None

    def pick(self, scores: Sequence[ChoiceScores]) -> tuple[int, list[float]]:
        if all(s.is_argmax is not None for s in scores):
            counts = [float(_leading_true(s.is_argmax or ())) for s in scores]
            keys = [(c, s.mean) for c, s in zip(counts, scores, strict=True)]
            best = max(range(len(keys)), key=lambda i: (keys[i], -i))
            return best, counts
        best = 0
        for i in range(1, len(scores)):
            if _lexicographically_better(scores[i], scores[best]):
                best = i
        return best, [s.token_logprobs[0] for s in scores]


def _lexicographically_better(a: ChoiceScores, b: ChoiceScores) -> bool:
    for x, y in zip(a.token_logprobs, b.token_logprobs, strict=False):
        if x != y:
            return x > y
    return a.mean > b.mean  # one is a token-prefix of the other: the likelier per token wins


def _leading_true(flags: Sequence[bool]) -> int:
    n = 0
    for f in flags:
        if not f:
            break
        n += 1
    return n


@dataclass(frozen=True)
class UnconditionalNormalized:
    """Pointwise mutual information per token: (sum cond - sum uncond) / len(cond tokens).

    Removes the prior of a choice's surface form (a frequent word is not preferred just
    because it is frequent). `context` is the neutral prefix; None uses the model's BOS
    (else EOS) token, i.e. "the start of a document".
    """

    name: str = "unconditional_normalized"
    needs_top: bool = False
    needs_unconditional: bool = True
    context: str | None = None

    def pick(self, scores: Sequence[ChoiceScores]) -> tuple[int, list[float]]:
        values: list[float] = []
        for s in scores:
            if s.unconditional_logprobs is None:
                raise ValueError("unconditional_normalized needs unconditional logprobs")
            diff = sum(s.token_logprobs) - sum(s.unconditional_logprobs)
            values.append(diff / len(s.token_logprobs))
        return _argmax(values), values


token_length_normalized = TokenLengthNormalized()
greedy_token = GreedyToken()
unconditional_normalized = UnconditionalNormalized()
