"""Executes a `select`: scores every choice with prompt-token logprobs from the backend.

Protocol (so the shared prefix is computed once and every choice hits the radix cache):
1. With the frontend hint on, a prefix-only request (max_new_tokens=0) caches the prompt,
   while `Tokenize` finds the prompt's token length n (the two run concurrently).
2. Each choice is sent as prompt + choice, prefill only, asking for prompt logprobs from
   position n - 1 (one token of slack: when prompt and choice merge into one token at the
   boundary, the merged token still gets a logprob). All choices go out concurrently.
3. A choice's tokens are the returned positions from the first one that differs from the
   prompt's own tokens; their logprobs feed the method's arithmetic (`choices.py`).

Invariant: a request asking for prompt logprobs from p reuses at most p - 1 cached tokens
(the logits scoring token p come from position p - 1), so step 2 recomputes two boundary
tokens plus the choice and nothing else of the (cached) prompt.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from functools import partial
from typing import Any, TypeVar

from radixmesh.lang.backend import Backend, Completion, Prompt, TokenLogprob
from radixmesh.lang.choices import (
    ChoiceScores,
    ChoicesDecision,
    ChoicesMethod,
    LogprobEntry,
    sglang_normalized,
)
from radixmesh.lang.errors import BackendError
from radixmesh.lang.stats import ProgramStats

T = TypeVar("T")

_pool_lock = threading.Lock()
_pool: ThreadPoolExecutor | None = None


def rpc_pool() -> ThreadPoolExecutor:
    """Shared pool for leaf requests. Its tasks never wait on each other, so it cannot
    deadlock however many selects are in flight; excess work just queues."""
    global _pool
    with _pool_lock:
        if _pool is None:
            _pool = ThreadPoolExecutor(max_workers=64, thread_name_prefix="radixmesh-rpc")
        return _pool


def map_calls(calls: Sequence[Callable[[], T]], *, parallel: bool) -> list[T]:
    """Results of `calls` in order; concurrently on the shared pool when `parallel`."""
    if not parallel or len(calls) <= 1:
        return [c() for c in calls]
    futures = [rpc_pool().submit(c) for c in calls]
    return [f.result() for f in futures]


@dataclass(frozen=True)
class SelectResult:
    """What a select decided, and why (the per-choice numbers behind the decision)."""

    choice: str
    index: int
    method: str
    scores: tuple[float, ...]
    token_logprobs: tuple[tuple[float, ...], ...]
    unconditional_logprobs: tuple[tuple[float, ...], ...] | None
    completions: tuple[Completion, ...]
    #: SGLang's meta info of a select (normalized_prompt_logprobs, input_token_logprobs, ...).
    meta_info: dict[str, Any] = field(default_factory=dict)


def choice_tokens(completion: Completion, prefix_ids: Sequence[int]) -> list[TokenLogprob]:
    """The returned prompt-token entries that belong to the continuation after `prefix_ids`.

    Position 0 is skipped (no context). Entries equal to the prefix's own token at the same
    position are prefix; the first differing (or past-the-prefix) position starts the choice.
    """
    out: list[TokenLogprob] = []
    for k, entry in enumerate(completion.prompt_logprobs):
        pos = completion.prompt_logprobs_from + k
        if pos == 0:
            continue
        if not out and pos < len(prefix_ids) and entry.token_id == prefix_ids[pos]:
            continue
        out.append(entry)
    return out


def boundary_entry(completion: Completion, prefix_ids: Sequence[int]) -> TokenLogprob | None:
    """The entry of the prompt's own last token when it survived unmerged (else None)."""
    last = len(prefix_ids) - 1
    k = last - completion.prompt_logprobs_from
    if last < 1 or not 0 <= k < len(completion.prompt_logprobs):
        return None
    entry = completion.prompt_logprobs[k]
    return entry if entry.token_id == prefix_ids[last] else None


def _score(
    backend: Backend, prompt: Prompt, prefix_ids: Sequence[int], *, top: int
) -> tuple[Completion, list[TokenLogprob]]:
    start = max(len(prefix_ids) - 1, 1)
    completion = backend.prompt_logprobs(prompt, start, top=top)
    tokens = choice_tokens(completion, prefix_ids)
    if not tokens:
        raise BackendError(
            f"no prompt logprobs came back for the choice (asked from position {start}, "
            f"got {len(completion.prompt_logprobs)} from {completion.prompt_logprobs_from})"
        )
    return completion, tokens


def _standalone(backend: Backend, ids: Sequence[int]) -> tuple[Completion, list[TokenLogprob]]:
    """Scores token ids with no context (SGLang's unconditional logprobs); position 0 has no
    logprob and is returned as 0.0."""
    if len(ids) < 2:
        return Completion(""), [TokenLogprob(ids[0], 0.0)] if ids else []
    completion = backend.prompt_logprobs(list(ids), 1)
    return completion, [TokenLogprob(ids[0], 0.0), *completion.prompt_logprobs]


def _entries(tokens: Sequence[TokenLogprob]) -> list[LogprobEntry]:
    return [(t.logprob, t.token_id, None) for t in tokens]


def _unconditional(
    backend: Backend, choice: str, context: str | None
) -> tuple[Completion, list[TokenLogprob]]:
    """Scores `choice` after the neutral context (see UnconditionalNormalized)."""
    if context is not None:
        context_ids = backend.tokenize(context)
        return _score(backend, context + choice, context_ids, top=0)
    info = backend.model_info()
    anchor = info.bos_token_id
    if anchor is None and info.eos_token_ids:
        anchor = info.eos_token_ids[0]
    if anchor is None:  # no document-start token: the choice's first token goes unscored
        return _score(backend, choice, [], top=0)
    ids = [anchor, *backend.tokenize(choice, add_special_tokens=False)]
    return _score(backend, ids, [anchor], top=0)


def run_select(
    backend: Backend,
    prefix: str,
    choices: Sequence[str],
    method: ChoicesMethod | Any,
    *,
    hint: bool,
    parallel: bool,
    stats: ProgramStats | None = None,
) -> SelectResult:
    """Scores `choices` after `prefix` and picks one by `method` (see module docstring)."""
    if hint and prefix:
        # The warm-up and Tokenize are independent: overlap them when parallelism is on.
        pending = rpc_pool().submit(backend.tokenize, prefix) if parallel else None
        warmed = backend.warm(prefix)
        prefix_ids = pending.result() if pending is not None else backend.tokenize(prefix)
        if stats is not None:
            stats.add("hint", warmed)
    else:
        prefix_ids = backend.tokenize(prefix) if prefix else []

    top = 1 if getattr(method, "needs_top", False) else 0
    calls: list[Callable[[], tuple[Completion, list[TokenLogprob]]]] = [
        partial(_score, backend, prefix + c, prefix_ids, top=top) for c in choices
    ]
    if getattr(method, "needs_unconditional", False):
        calls += [partial(_unconditional, backend, c, method.context) for c in choices]
    results = map_calls(calls, parallel=parallel)
    if stats is not None:
        for completion, _ in results:
            stats.add("select", completion)

    n = len(choices)
    conditional = [[t.logprob for t in toks] for _, toks in results[:n]]
    normalized: list[float] = []
    for completion, toks in results[:n]:
        boundary = boundary_entry(completion, prefix_ids)
        values = ([boundary.logprob] if boundary else []) + [t.logprob for t in toks]
        normalized.append(sglang_normalized(values, boundary_is_prompt=boundary is not None))
    inputs = [_entries(toks) for _, toks in results[:n]]
    meta: dict[str, Any] = {
        "normalized_prompt_logprobs": normalized,
        "input_token_logprobs": inputs,
        "output_token_logprobs": [[] for _ in choices],
    }
    if not hasattr(method, "pick"):  # an SGLang-style ChoicesSamplingMethod
        return _decide(backend, choices, method, results[:n], meta, parallel=parallel, stats=stats)
    unconditional = [[t.logprob for t in toks] for _, toks in results[n:]] or None
    scores = []
    for i, (_, toks) in enumerate(results[:n]):
        argmax: tuple[bool, ...] | None = None
        if top and all(t.top for t in toks):
            argmax = tuple(t.top[0][0] == t.token_id for t in toks)
        scores.append(
            ChoiceScores(
                token_logprobs=tuple(conditional[i]),
                is_argmax=argmax,
                unconditional_logprobs=tuple(unconditional[i]) if unconditional else None,
                normalized=normalized[i],
            )
        )
    index, values = method.pick(scores)
    meta["scores"] = values
    return SelectResult(
        choice=choices[index],
        index=index,
        method=method.name,
        scores=tuple(values),
        token_logprobs=tuple(tuple(x) for x in conditional),
        unconditional_logprobs=tuple(tuple(x) for x in unconditional) if unconditional else None,
        completions=tuple(c for c, _ in results),
        meta_info=meta,
    )


def _decide(
    backend: Backend,
    choices: Sequence[str],
    method: Any,
    results: list[tuple[Completion, list[TokenLogprob]]],
    meta: dict[str, Any],
    *,
    parallel: bool,
    stats: ProgramStats | None,
) -> SelectResult:
    """Runs an SGLang-style method: `method(choices=..., ...)` returns a ChoicesDecision."""
    uncond_results: list[tuple[Completion, list[TokenLogprob]]] = []
    if getattr(method, "requires_unconditional_logprobs", False):
        calls = [
            partial(_standalone, backend, [e[1] for e in entries])
            for entries in meta["input_token_logprobs"]
        ]
        uncond_results = map_calls(calls, parallel=parallel)
        if stats is not None:
            for completion, _ in uncond_results:
                stats.add("select", completion)
    unconditional = [_entries(toks) for _, toks in uncond_results] or None
    decision = method(
        choices=list(choices),
        normalized_prompt_logprobs=meta["normalized_prompt_logprobs"],
        input_token_logprobs=meta["input_token_logprobs"],
        output_token_logprobs=meta["output_token_logprobs"],
        unconditional_token_logprobs=unconditional,
    )
    if not isinstance(decision, ChoicesDecision) or decision.decision not in choices:
        raise ValueError(f"choices method {method!r} must return a ChoicesDecision of a choice")
    index = list(choices).index(decision.decision)
    info = dict(decision.meta_info or meta)
    return SelectResult(
        choice=decision.decision,
        index=index,
        method=getattr(method, "name", type(method).__name__),
        scores=tuple(meta["normalized_prompt_logprobs"]),
        token_logprobs=tuple(tuple(e[0] or 0.0 for e in x) for x in meta["input_token_logprobs"]),
        unconditional_logprobs=(
            tuple(tuple(e[0] or 0.0 for e in x) for x in unconditional) if unconditional else None
        ),
        completions=tuple(c for c, _ in results + uncond_results),
        meta_info=info,
    )
