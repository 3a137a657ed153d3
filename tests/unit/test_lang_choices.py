"""select: the methods' arithmetic, choice-token alignment and the scoring protocol."""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Iterator, Sequence

import pytest
import radixmesh as rm
from radixmesh.lang.backend import Completion, TokenLogprob
from radixmesh.lang.choices import (
    ChoiceScores,
    GreedyToken,
    TokenLengthNormalized,
    UnconditionalNormalized,
)
from radixmesh.lang.meta import MetaInfo
from radixmesh.lang.scoring import choice_tokens, run_select
from radixmesh.lang.scripted import Call, ScriptedBackend


@pytest.fixture(autouse=True)
def _restore_config() -> Iterator[None]:
    saved = dataclasses.replace(rm.global_config)
    yield
    rm.global_config.__dict__.update(saved.__dict__)


# ---- arithmetic ----------------------------------------------------------------------


def test_token_length_normalized_is_the_mean_logprob() -> None:
    scores = [ChoiceScores((-0.5, -0.5)), ChoiceScores((-0.7,))]
    index, values = TokenLengthNormalized().pick(scores)
    assert values == [-0.5, -0.7] and index == 0  # the sum would have picked choice 1


def test_ties_go_to_the_earliest_choice() -> None:
    scores = [ChoiceScores((-1.0,)), ChoiceScores((-1.0,))]
    assert TokenLengthNormalized().pick(scores)[0] == 0
    assert GreedyToken().pick(scores)[0] == 0


def test_greedy_token_counts_leading_argmax_tokens() -> None:
    scores = [
        ChoiceScores((-0.2, -3.0), is_argmax=(True, False)),
        ChoiceScores((-0.9, -0.1, -0.1), is_argmax=(True, True, True)),
        ChoiceScores((-0.1,), is_argmax=(False,)),
    ]
    index, values = GreedyToken().pick(scores)
    assert values == [1.0, 3.0, 0.0] and index == 1


def test_greedy_token_breaks_count_ties_by_mean() -> None:
    scores = [
        ChoiceScores((-0.2, -3.0), is_argmax=(True, False)),
        ChoiceScores((-0.3,), is_argmax=(True,)),
    ]
    assert GreedyToken().pick(scores)[0] == 1  # both 1 greedy token; -0.3 > -1.6


def test_greedy_token_without_top_data_compares_lexicographically() -> None:
    scores = [ChoiceScores((-0.5, -9.0)), ChoiceScores((-0.4, -9.0)), ChoiceScores((-0.5, -0.1))]
    index, values = GreedyToken().pick(scores)
    assert index == 1 and values == [-0.5, -0.4, -0.5]
    assert GreedyToken().pick([scores[0], scores[2]])[0] == 1  # first tie, second decides


def test_unconditional_normalized_is_per_token_pmi() -> None:
    scores = [
        ChoiceScores((-0.5, -0.5), unconditional_logprobs=(-0.1, -0.1)),
        ChoiceScores((-0.7,), unconditional_logprobs=(-2.0,)),
    ]
    index, values = UnconditionalNormalized().pick(scores)
    assert values == pytest.approx([(-1.0 + 0.2) / 2, -0.7 + 2.0]) and index == 1
    with pytest.raises(ValueError):
        UnconditionalNormalized().pick([ChoiceScores((-1.0,))])


# ---- alignment -----------------------------------------------------------------------


def completion(start: int, entries: Sequence[tuple[int, float]]) -> Completion:
    lps = tuple(TokenLogprob(i, lp) for i, lp in entries)
    return Completion("", prompt_logprobs=lps, prompt_logprobs_from=start)


def test_choice_tokens_skip_the_prefix_slack_token() -> None:
    got = choice_tokens(completion(2, [(7, -0.1), (8, -1.0)]), [5, 6, 7])
    assert [t.token_id for t in got] == [8]


def test_choice_tokens_keep_a_boundary_token_merged_with_the_choice() -> None:
    # "...ab" + "c" tokenized as [5, 6, 9(="bc"), 10]: token 9 carries the choice's start.
    got = choice_tokens(completion(2, [(9, -0.3), (10, -1.0)]), [5, 6, 7])
    assert [t.token_id for t in got] == [9, 10]


def test_choice_tokens_never_score_position_zero() -> None:
    got = choice_tokens(completion(0, [(3, 0.0), (4, -1.0)]), [])
    assert [t.token_id for t in got] == [4]


# ---- the scoring protocol against the scripted backend -------------------------------

TABLE = {" very": -0.5, " good": -0.5, " bad": -0.7}
NEUTRAL = {" very": -0.1, " good": -0.1, " bad": -2.0}


def table_logprob(context: Sequence[str], token: str) -> float:
    if list(context) in (["<eos>"], ["<eos>", " very"]):
        return NEUTRAL.get(token, -5.0)
    return TABLE.get(token, -5.0)


def test_run_select_warms_the_prefix_then_scores_all_choices_concurrently() -> None:
    barrier = threading.Barrier(2, timeout=5)

    def on_call(call: Call) -> None:
        if call.kind == "score":
            barrier.wait()  # both choices must be in flight together

    backend = ScriptedBackend(logprob=table_logprob, on_call=on_call)
    result = run_select(
        backend,
        "Rate it: it was",
        [" very good", " bad"],
        rm.token_length_normalized,
        hint=True,
        parallel=True,
    )
    assert result.choice == " very good" and result.index == 0
    assert result.token_logprobs == ((-0.5, -0.5), (-0.7,))
    kinds = [c.kind for c in backend.calls]
    assert kinds == ["warm", "score", "score"]
    # "Rate it: it was" is 4 scripted tokens: logprobs from position 3 (one token of slack).
    assert {c.logprobs_from for c in backend.calls[1:]} == {3}
    assert all(c.prompt.startswith("Rate it: it was") for c in backend.calls)
    # With the hint, every choice request finds the prefix cached up to position 2: the
    # logits scoring position 3 come from position 2, which is recomputed.
    assert all(c.cached_tokens == 2 for c in result.completions)


def test_run_select_without_hint_sends_no_warm_request() -> None:
    backend = ScriptedBackend(logprob=table_logprob)
    run_select(
        backend,
        "Rate it:",
        [" very good", " bad"],
        rm.token_length_normalized,
        hint=False,
        parallel=False,
    )
    assert [c.kind for c in backend.calls] == ["score", "score"]


def test_greedy_select_uses_top1_prompt_logprobs() -> None:
    backend = ScriptedBackend(logprob=table_logprob, top=lambda context: " bad")
    result = run_select(
        backend, "Rate it:", [" very good", " bad"], rm.greedy_token, hint=True, parallel=True
    )
    assert result.choice == " bad" and result.scores == (0.0, 1.0)


def test_unconditional_select_scores_choices_after_the_document_start_token() -> None:
    backend = ScriptedBackend(logprob=table_logprob)
    result = run_select(
        backend,
        "Rate it:",
        [" very good", " bad"],
        rm.unconditional_normalized,
        hint=False,
        parallel=True,
    )
    assert result.unconditional_logprobs == ((-0.1, -0.1), (-2.0,))
    assert result.choice == " bad"
    neutral = [c for c in backend.calls if not c.prompt.startswith("Rate")]
    assert len(neutral) == 2 and {c.logprobs_from for c in neutral} == {1}


def test_unconditional_select_with_a_text_context() -> None:
    seen: list[str] = []

    def logprob(context: Sequence[str], token: str) -> float:
        seen.append("".join(context))
        return -1.0

    backend = ScriptedBackend(logprob=logprob)
    method = UnconditionalNormalized(context="Answer:")
    run_select(backend, "Q: x A:", [" yes", " no"], method, hint=False, parallel=False)
    assert "Answer:" in seen


def test_select_in_a_program_appends_the_choice_and_records_meta() -> None:
    backend = ScriptedBackend(logprob=table_logprob)

    @rm.function
    def prog(s: rm.ProgramState) -> None:
        s += "It was" + rm.select("rating", [" very good", " bad"]) + "."

    state = prog.run(backend=backend)
    assert state.text() == "It was very good."
    meta = state.get_meta_info("rating")
    assert isinstance(meta, dict)  # SGLang's plain dict ...
    assert isinstance(meta, MetaInfo) and isinstance(meta.source, rm.SelectResult)  # ... and more
    assert meta.scores == pytest.approx((-0.5, -0.7))  # attribute reads reach the SelectResult
    assert meta["normalized_prompt_logprobs"] == pytest.approx([-0.5, -0.7])
    assert state.stats.requests[0].kind == "hint"
    assert [r.kind for r in state.stats.requests].count("select") == 2


def test_select_rejects_bad_choices() -> None:
    with pytest.raises(ValueError):
        rm.select("x", [])
    with pytest.raises(ValueError):
        rm.select("x", ["a", ""])
    with pytest.raises(TypeError):
        rm.select("x", "ab")


def test_gen_with_choices_is_a_select() -> None:
    expr = rm.gen("x", choices=["a", "b"])
    assert isinstance(expr, rm.lang.ir.Select) and expr.choices == ("a", "b")
