"""`s.get_meta_info(name)`: SGLang's meta-info dict for a gen or select variable.

SGLang programs read it as a dict (`meta["completion_tokens"]`, `meta["input_token_logprobs"]`,
`meta.get("prompt_length")`); RadixMesh's own code reads the typed object behind it, so the
dict also forwards attribute reads to `source` (`meta.cached_tokens`, `meta.scores`).

Logprob entries follow SGLang: `(logprob, token_id, text)` tuples, `text` None unless the gen
asked for `return_text_in_logprobs=True`; top logprobs are one list of such tuples per position.
A `gen(max_tokens=0, top_logprobs_num=k)` has no output token and one output position: its
`output_top_logprobs[0]` is the top k of the next-token distribution, as in SGLang.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from radixmesh.lang.backend import Completion, TokenLogprob
from radixmesh.lang.scoring import SelectResult

Detokenize = Callable[[int], str]
Entry = tuple[float | None, int, str | None]


class MetaInfo(dict[str, Any]):
    """A plain dict of SGLang's keys; unknown attributes are read from `source`."""

    def __init__(self, data: dict[str, Any], source: Completion | SelectResult) -> None:
        super().__init__(data)
        self.source = source

    def __getattr__(self, name: str) -> Any:
        if name == "source":  # not set yet (unpickling): avoid recursing
            raise AttributeError(name)
        return getattr(self.source, name)


def _entries(tokens: Sequence[TokenLogprob], text: Detokenize | None) -> list[Entry]:
    return [(t.logprob, t.token_id, text(t.token_id) if text else None) for t in tokens]


def _tops(tokens: Sequence[TokenLogprob], text: Detokenize | None) -> list[list[Entry]]:
    return [[(lp, tid, text(tid) if text else None) for tid, lp in t.top] for t in tokens]


def gen_meta(completion: Completion, *, text: Detokenize | None = None) -> MetaInfo:
    """SGLang's gen meta info; logprob keys only when the request returned logprobs."""
    finish: dict[str, Any] = {"type": completion.finish_reason}
    if completion.finish_reason == "stop" and completion.matched_stop:
        finish["matched"] = completion.matched_stop
    elif completion.finish_reason == "length":
        finish["length"] = completion.completion_tokens
    data: dict[str, Any] = {
        "id": completion.request_id,
        "prompt_tokens": completion.prompt_tokens,
        "completion_tokens": completion.completion_tokens,
        "cached_tokens": completion.cached_tokens,
        "finish_reason": finish,
    }
    if completion.output_logprobs or completion.prompt_logprobs or completion.next_token_top:
        data["input_token_logprobs"] = _entries(completion.prompt_logprobs, text)
        data["output_token_logprobs"] = _entries(completion.output_logprobs, text)
        data["input_top_logprobs"] = _tops(completion.prompt_logprobs, text)
        data["output_top_logprobs"] = _tops(completion.output_logprobs, text)
        if completion.next_token_top:  # a max_tokens=0 gen: the next token's top k
            top = TokenLogprob(-1, 0.0, completion.next_token_top)
            data["output_top_logprobs"] = _tops([top], text)
    return MetaInfo(data, completion)


def select_meta(result: SelectResult) -> MetaInfo:
    return MetaInfo(dict(result.meta_info), result)
