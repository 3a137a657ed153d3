"""How `select` picks a choice from per-token logprobs (pure arithmetic, no I/O).

For every choice the scorer (`scoring.py`) provides a `ChoiceScores`: the logprob of each of
the choice's tokens given the prompt, whether each token was the model's argmax (when the
server returned top-1 alternatives), and, for `unconditional_normalized`, the logprobs of
the same choice after a neutral context.

Invariants: every method returns one score per choice and the index of the best one; ties go
to the earliest choice (stable, so results never depend on thread timing).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

#: One prompt-token entry as SGLang reports it: (logprob, token_id, token text or None).
LogprobEntry = tuple[float | None, int, str | None]


@dataclass(frozen=True)
class ChoiceScores:
    """`normalized` is SGLang's `normalized_prompt_logprobs` value for the choice (see
    `sglang_normalized`); it equals the mean of `token_logprobs` unless a logprob is 0.0."""

    token_logprobs: tuple[float, ...]
    is_argmax: tuple[bool, ...] | None = None
    unconditional_logprobs: tuple[float, ...] | None = None
    normalized: float | None = None

    @property
    def mean(self) -> float:
        return sum(self.token_logprobs) / len(self.token_logprobs)


def sglang_normalized(entries: Sequence[float], *, boundary_is_prompt: bool) -> float:
    """SGLang's select score, reproduced exactly so close calls rank the same.

    SGLang asks for logprobs from the last prompt token on (`entries[0]`) and averages the
    non-zero ones; when that first token is the prompt's own (no merge across the boundary,
    "no token healing") it then takes it back out with `(mean * len - first) / (len - 1)`.
    Without exact-zero logprobs this is the mean of the choice's tokens.
    """
    nonzero = [x for x in entries if x]
    mean = sum(nonzero) / len(nonzero) if nonzero else 0.0
    if boundary_is_prompt and len(entries) > 1:
        return (mean * len(entries) - entries[0]) / (len(entries) - 1)
    return mean


@dataclass(frozen=True)
class ChoicesDecision:
    """What an SGLang-style choices method returns: the chosen text and its evidence."""

    decision: str
    meta_info: dict[str, Any] | None = None


class ChoicesSamplingMethod(ABC):
    """SGLang's interface for a select rule (subclass it for a custom rule): called with the
    keyword arguments below, where each `*_token_logprobs` item is a list of
    `(logprob, token_id, text)` entries of one choice."""

    @property
    def requires_unconditional_logprobs(self) -> bool:
        return False

    @abstractmethod
    def __call__(
        self,
        *,
        choices: list[str],
        normalized_prompt_logprobs: list[float],
        input_token_logprobs: list[list[LogprobEntry]],
        output_token_logprobs: list[list[LogprobEntry]],
        unconditional_token_logprobs: list[list[LogprobEntry]] | None = None,
    ) -> ChoicesDecision: ...


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
        values = [s.mean if s.normalized is None else s.normalized for s in scores]
        return _argmax(values), values

    def __call__(
        self,
        *,
        choices: list[str],
        normalized_prompt_logprobs: list[float],
        input_token_logprobs: list[list[LogprobEntry]],
        output_token_logprobs: list[list[LogprobEntry]],
        unconditional_token_logprobs: list[list[LogprobEntry]] | None = None,
    ) -> ChoicesDecision:
        """SGLang's calling convention (so programs may call the method directly)."""
        best = _argmax(normalized_prompt_logprobs)
        meta = {
            "normalized_prompt_logprobs": normalized_prompt_logprobs,
            "input_token_logprobs": input_token_logprobs,
            "output_token_logprobs": output_token_logprobs,
        }
        return ChoicesDecision(choices[best], meta)


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


def _values(entries: Sequence[LogprobEntry]) -> list[float]:
    return [e[0] or 0.0 for e in entries]


class GreedyTokenSelection(ChoicesSamplingMethod):
    """SGLang's `greedy_token_selection`: compare the choices token by token, keeping those
    with the highest logprob at each position until one is left; a shorter choice is padded
    with its own mean logprob. Ties after the last position go to the earliest choice."""

    name = "greedy_token_selection"

    def __call__(
        self,
        *,
        choices: list[str],
        normalized_prompt_logprobs: list[float],
        input_token_logprobs: list[list[LogprobEntry]],
        output_token_logprobs: list[list[LogprobEntry]],
        unconditional_token_logprobs: list[list[LogprobEntry]] | None = None,
    ) -> ChoicesDecision:
        width = max(len(entries) for entries in input_token_logprobs)
        matrix: list[list[float]] = []
        for entries in input_token_logprobs:
            row = _values(entries)
            pad = sum(row) / len(row) if row else float("nan")
            matrix.append(row + [pad] * (width - len(row)))
        remaining = list(range(len(choices)))
        for j in range(width):
            best = max(matrix[i][j] for i in remaining)
            remaining = [i for i in remaining if matrix[i][j] == best]
            if len(remaining) == 1:
                break
        meta = {
            "normalized_prompt_logprobs": normalized_prompt_logprobs,
            "input_token_logprobs": input_token_logprobs,
            "output_token_logprobs": output_token_logprobs,
            "greedy_logprob_matrix": matrix,
        }
        return ChoicesDecision(choices[remaining[0]], meta)


class UnconditionalLikelihoodNormalized(ChoicesSamplingMethod):
    """SGLang's `unconditional_likelihood_normalized`: mean over the choice's tokens of
    logprob(token | prompt) - logprob(token | the choice's preceding tokens alone); the first
    token has no unconditional context, so its unconditional logprob counts as 0."""

    name = "unconditional_likelihood_normalized"

    @property
    def requires_unconditional_logprobs(self) -> bool:
        return True

    def __call__(
        self,
        *,
        choices: list[str],
        normalized_prompt_logprobs: list[float],
        input_token_logprobs: list[list[LogprobEntry]],
        output_token_logprobs: list[list[LogprobEntry]],
        unconditional_token_logprobs: list[list[LogprobEntry]] | None = None,
    ) -> ChoicesDecision:
        if unconditional_token_logprobs is None:
            raise ValueError("unconditional token logprobs are required for this method")
        values: list[float] = []
        for cond, uncond in zip(input_token_logprobs, unconditional_token_logprobs, strict=True):
            a, b = _values(cond), _values(uncond)
            if len(a) != len(b):
                raise ValueError("input and unconditional token logprobs differ in length")
            values.append(sum(x - y for x, y in zip(a, b, strict=True)) / len(a))
        meta = {
            "normalized_prompt_logprobs": normalized_prompt_logprobs,
            "input_token_logprobs": input_token_logprobs,
            "output_token_logprobs": output_token_logprobs,
            "unconditional_token_logprobs": unconditional_token_logprobs,
            "normalized_unconditional_prompt_logprobs": values,
        }
        return ChoicesDecision(choices[_argmax(values)], meta)


greedy_token_selection = GreedyTokenSelection()
unconditional_likelihood_normalized = UnconditionalLikelihoodNormalized()
