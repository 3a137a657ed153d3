"""Executes one `gen` for a stream: logprob options, `n` samples, speculation, reasoning split.

Pure functions over a backend; the stream executor (`interpreter.py`) owns the prompt text and
calls these with it. Kept apart so the executor stays about ordering, not request details.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial

from radixmesh.lang.backend import Backend, Completion, LogprobRequest, TextCallback
from radixmesh.lang.meta import MetaInfo, gen_meta
from radixmesh.lang.params import GenParams
from radixmesh.lang.scoring import map_calls


def logprob_request(params: GenParams) -> LogprobRequest | None:
    """SGLang's per-gen logprob options as a LogprobRequest (None when none are asked)."""
    if not (params.return_logprob or params.top_logprobs_num or params.logprob_start_len):
        return None
    start = params.logprob_start_len
    return LogprobRequest(
        # position 0 has no logprob; a negative start means "output only", as in SGLang
        prompt_logprobs_from=None if start is None or start < 0 else max(start, 1),
        top_logprobs=params.top_logprobs_num or 0,
        return_logprob=True,
    )


def generate_samples(
    backend: Backend,
    prompt: str,
    params: GenParams,
    *,
    parallel: bool,
    on_text: TextCallback | None,
) -> list[Completion]:
    """`params.n` independent completions (one request each, concurrently); the first one
    streams through `on_text`."""
    logprobs = logprob_request(params)
    n = params.n or 1
    calls: list[Callable[[], Completion]] = [
        partial(backend.generate, prompt, params, logprobs=logprobs, on_text=on_text)
    ]
    calls += [partial(backend.generate, prompt, params, logprobs=logprobs) for _ in range(n - 1)]
    return map_calls(calls, parallel=parallel)


def meta_for(backend: Backend, completion: Completion, params: GenParams) -> MetaInfo:
    """The gen's meta info; with `return_text_in_logprobs` each token's text is looked up."""
    if not params.return_text_in_logprobs:
        return gen_meta(completion)
    detokenize = getattr(backend, "detokenize", None)
    if detokenize is None:
        return gen_meta(completion)
    cache: dict[int, str] = {}

    def text(token_id: int) -> str:
        if token_id not in cache:
            cache[token_id] = detokenize([token_id])
        return cache[token_id]

    return gen_meta(completion, text=text)


def split_reasoning(value: str, begin: str, end: str) -> tuple[str, str]:
    """(answer, reasoning) of a reasoning model's output: the text inside `begin`...`end`
    (a missing `begin` means the model started inside the block, as R1-style templates do)."""
    cut = value.find(end)
    if cut < 0:
        return value, ""
    reasoning = value[:cut]
    start = reasoning.find(begin)
    if start >= 0:
        reasoning = reasoning[start + len(begin) :]
    return value[cut + len(end) :].lstrip(), reasoning.strip()
