"""Executes one `gen` for a stream: logprob options, `n` samples, speculation, reasoning split.

Pure functions over a backend; the stream executor (`interpreter.py`) owns the prompt text and
calls these with it. Kept apart so the executor stays about ordering, not request details.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
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


def wants_next_token_top(params: GenParams) -> bool:
    """`gen(max_tokens=0, top_logprobs_num=k)`: SGLang returns the top k of the next-token
    distribution after the prompt as `output_top_logprobs[0]` (CoT decoding forks on it)."""
    return params.max_new_tokens == 0 and bool(params.top_logprobs_num)


def next_token_probe(params: GenParams) -> GenParams:
    """The request that yields that distribution. The runtime reports top logprobs only for a
    sampled position (a prefill-only request computes no next-token logits, and
    `GenerateComplete` has no field for them), so the probe samples one token, greedily and
    with nothing able to stop it first, and reads the top k of that position: logprobs come
    from the unmodified distribution, whatever is sampled. `next_token_view` then drops the
    token itself."""
    return params.replace(
        max_new_tokens=1,
        min_new_tokens=None,
        temperature=0.0,
        ignore_eos=True,
        stop=(),
        stop_token_ids=(),
        n=None,
    )


def next_token_view(probe: Completion) -> Completion:
    """The probe as the `max_tokens=0` gen it stands for: no text and no output token, the
    prompt's accounting, and the first position's alternatives as `next_token_top`."""
    top = probe.output_logprobs[0].top if probe.output_logprobs else ()
    return replace(
        probe,
        text="",
        output_ids=(),
        finish_reason="length",
        matched_stop="",
        completion_tokens=0,
        output_logprobs=(),
        next_token_top=top,
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
    streams through `on_text`. A `max_tokens=0` gen asking for top logprobs is sent as the
    one-token probe (`next_token_probe`); the caller shows it with `next_token_view`."""
    if wants_next_token_top(params):
        params = next_token_probe(params)
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
