"""Sampling parameters of a `gen` call, mirroring `radixmesh.v1.SamplingParams`.

Invariant: a field left as None means "not set here": it is filled from the program's
defaults (`merged_over`) and, if still None, left unset on the wire so the server default
applies (proto3 zero values differ from real defaults, e.g. temperature 1).
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, fields
from typing import Any


@dataclass(frozen=True)
class GenParams:
    """Sampling knobs; at most one of regex / json_schema / ebnf may be set."""

    max_new_tokens: int | None = None
    min_new_tokens: int | None = None
    stop: tuple[str, ...] = ()
    stop_token_ids: tuple[int, ...] = ()
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    min_p: float | None = None
    seed: int | None = None
    ignore_eos: bool | None = None
    regex: str | None = None
    json_schema: str | None = None
    ebnf: str | None = None
    # Not sampling knobs but per-gen request options (SGLang passes them the same way).
    n: int | None = None
    return_logprob: bool | None = None
    logprob_start_len: int | None = None
    top_logprobs_num: int | None = None
    return_text_in_logprobs: bool | None = None

    def __post_init__(self) -> None:
        constraints = [c for c in (self.regex, self.json_schema, self.ebnf) if c is not None]
        if len(constraints) > 1:
            raise ValueError("at most one of regex, json_schema, ebnf may be given")
        if self.max_new_tokens is not None and self.max_new_tokens < 0:
            raise ValueError("max_new_tokens must be >= 0")
        if self.n is not None and self.n < 1:
            raise ValueError("n must be >= 1")

    @property
    def constrained(self) -> bool:
        return any(c is not None for c in (self.regex, self.json_schema, self.ebnf))

    def merged_over(self, defaults: GenParams) -> GenParams:
        """Fields set here win; unset ones come from `defaults`.

        A constraint is all-or-nothing: a gen with its own regex does not inherit a
        default json_schema (that would violate the one-constraint rule).
        """
        updates: dict[str, Any] = {}
        for f in fields(self):
            mine = getattr(self, f.name)
            if mine is None or mine == ():
                updates[f.name] = getattr(defaults, f.name)
            else:
                updates[f.name] = mine
        if self.constrained:
            updates.update(regex=self.regex, json_schema=self.json_schema, ebnf=self.ebnf)
        return GenParams(**updates)

    def replace(self, **changes: Any) -> GenParams:
        return dataclasses.replace(self, **changes)


#: Keyword names accepted as sampling defaults by `run` / `run_batch` (plus `max_tokens`).
SAMPLING_KEYS: frozenset[str] = frozenset(f.name for f in fields(GenParams)) | {
    "max_tokens",
    "frequency_penalty",
    "presence_penalty",
}


def make_params(
    *,
    max_tokens: int | None = None,
    max_new_tokens: int | None = None,
    min_new_tokens: int | None = None,
    stop: str | Sequence[str] | None = None,
    stop_token_ids: Sequence[int] | None = None,
    temperature: float | None = None,
    top_p: float | None = None,
    top_k: int | None = None,
    min_p: float | None = None,
    seed: int | None = None,
    ignore_eos: bool | None = None,
    regex: str | None = None,
    json_schema: str | Mapping[str, Any] | None = None,
    ebnf: str | None = None,
    n: int | None = None,
    return_logprob: bool | None = None,
    logprob_start_len: int | None = None,
    top_logprobs_num: int | None = None,
    return_text_in_logprobs: bool | None = None,
    frequency_penalty: float | None = None,
    presence_penalty: float | None = None,
) -> GenParams:
    """Normalises user-facing spellings (`max_tokens`, a single stop string, a schema dict)."""
    if max_tokens is not None and max_new_tokens is not None and max_tokens != max_new_tokens:
        raise ValueError("give max_tokens or max_new_tokens, not both")
    for knob, value in (
        ("frequency_penalty", frequency_penalty),
        ("presence_penalty", presence_penalty),
    ):
        if value:  # accepted for SGLang's signature; a real penalty must not be dropped silently
            raise ValueError(f"{knob} is not supported by RadixMesh (got {value})")
    stops: tuple[str, ...] = (stop,) if isinstance(stop, str) else tuple(stop or ())
    schema = (
        json_schema
        if json_schema is None or isinstance(json_schema, str)
        else (json.dumps(json_schema, separators=(",", ":")))
    )
    return GenParams(
        max_new_tokens=max_new_tokens if max_new_tokens is not None else max_tokens,
        min_new_tokens=min_new_tokens,
        stop=stops,
        stop_token_ids=tuple(stop_token_ids or ()),
        temperature=temperature,
        top_p=top_p,
        top_k=top_k,
        min_p=min_p,
        seed=seed,
        ignore_eos=ignore_eos,
        regex=regex,
        json_schema=schema,
        ebnf=ebnf,
        n=n,
        return_logprob=return_logprob,
        logprob_start_len=logprob_start_len,
        top_logprobs_num=top_logprobs_num,
        return_text_in_logprobs=return_text_in_logprobs,
    )


def params_from_kwargs(kwargs: Mapping[str, Any]) -> GenParams:
    """`make_params(**kwargs)` restricted to SAMPLING_KEYS (unknown keys are a TypeError)."""
    unknown = set(kwargs) - SAMPLING_KEYS
    if unknown:
        raise TypeError(f"unknown sampling parameters: {sorted(unknown)}")
    return make_params(**kwargs)


def split_sampling(
    kwargs: Mapping[str, Any], program_params: frozenset[str] | set[str]
) -> tuple[dict[str, Any], GenParams]:
    """Separates a program's own keyword arguments from sampling defaults.

    A key that names a parameter of the program goes to the program (so a program argument
    called `temperature` still works); any other key in SAMPLING_KEYS is a sampling default.
    """
    program: dict[str, Any] = {}
    sampling: dict[str, Any] = {}
    for key, value in kwargs.items():
        if key in program_params or key not in SAMPLING_KEYS:
            program[key] = value
        else:
            sampling[key] = value
    return program, params_from_kwargs(sampling)
