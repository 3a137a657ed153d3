"""run_batch: input ordering, progress, concurrency, the prefix warm-up, failure isolation."""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Iterator

import pytest
import radixmesh as rm
from radixmesh.lang.params import GenParams
from radixmesh.lang.scripted import Call, ScriptedBackend


@pytest.fixture(autouse=True)
def _restore_config() -> Iterator[None]:
    saved = dataclasses.replace(rm.global_config)
    yield
    rm.global_config.__dict__.update(saved.__dict__)


@rm.function
def qa(s: rm.ProgramState, question: str) -> None:
    s += rm.system("Answer in one word.")
    s += rm.user("Question: " + question)
    s += rm.assistant(rm.gen("answer"))


def upper(prompt: str, params: GenParams) -> str:
    question = prompt.split("Question: ")[-1].split("<|im_end|>")[0]
    return question.upper()


def test_results_are_in_input_order_with_progress() -> None:
    seen: list[tuple[int, int]] = []
    questions = [f"q{i}" for i in range(20)]
    states = qa.run_batch(
        [{"question": q} for q in questions],
        backend=ScriptedBackend(upper),
        num_threads=8,
        progress_bar=lambda done, total: seen.append((done, total)),
    )
    assert [s["answer"] for s in states] == [q.upper() for q in questions]
    assert seen == [(i, 20) for i in range(1, 21)]


def test_programs_run_concurrently_up_to_num_threads() -> None:
    barrier = threading.Barrier(4, timeout=5)

    def on_call(call: Call) -> None:
        if call.kind == "gen":
            barrier.wait()  # needs 4 programs in flight at once

    backend = ScriptedBackend(upper, on_call=on_call)
    states = qa.run_batch([{"question": f"q{i}"} for i in range(8)], backend=backend, num_threads=4)
    assert all(s.error() is None for s in states)
    assert backend.max_inflight == 4


def test_num_threads_one_and_disabled_parallelism_run_sequentially() -> None:
    backend = ScriptedBackend(upper)
    qa.run_batch([{"question": f"q{i}"} for i in range(6)], backend=backend, num_threads=1)
    assert backend.max_inflight == 1
    rm.global_config.enable_parallelism = False
    backend = ScriptedBackend(upper)
    states = qa.run_batch([{"question": f"q{i}"} for i in range(6)], backend=backend)
    assert backend.max_inflight == 1
    prompts = [c.prompt.split("Question: ")[1][:2] for c in backend.calls_of("gen")]
    assert prompts == [f"q{i}" for i in range(6)] and len(states) == 6


def test_constant_prefix_is_warmed_once_before_the_programs() -> None:
    backend = ScriptedBackend(upper)
    states = qa.run_batch([{"question": f"q{i}"} for i in range(5)], backend=backend)
    assert [c.kind for c in backend.calls].count("warm") == 1
    warm = backend.calls[0]
    assert warm.kind == "warm"
    assert warm.prompt.endswith("<|im_start|>user\nQuestion: ")
    assert all(c.prompt.startswith(warm.prompt) for c in backend.calls[1:])
    assert states.prefix_warm is not None
    # Every program's gen found the whole constant prefix in the cache.
    prefix_tokens = len(backend.tokenize(warm.prompt))
    assert all(s.stats.requests[0].cached_tokens >= prefix_tokens - 1 for s in states)
    assert states.cache_hit_rate() > 0.5


def test_no_warm_when_the_hint_is_off_or_the_program_cannot_be_traced() -> None:
    rm.global_config.enable_fork_hint = False
    backend = ScriptedBackend(upper)
    qa.run_batch([{"question": "a"}, {"question": "b"}], backend=backend)
    assert "warm" not in [c.kind for c in backend.calls]
    rm.global_config.enable_fork_hint = True

    @rm.function
    def branchy(s: rm.ProgramState, question: str) -> None:
        s += question + rm.gen("a")
        if s["a"] == "stop":
            return

    backend = ScriptedBackend(upper)
    states = branchy.run_batch([{"question": "a"}, {"question": "b"}], backend=backend)
    assert "warm" not in [c.kind for c in backend.calls] and states.prefix_warm is None

    # As SGLang's prefix extraction: a program that cannot be traced to its end still
    # warms the constant text traced before the data dependency.
    @rm.function
    def branchy_with_intro(s: rm.ProgramState, question: str) -> None:
        s += "Intro. Q: " + question + rm.gen("a")
        if s["a"] == "stop":
            return

    backend = ScriptedBackend(upper)
    states = branchy_with_intro.run_batch([{"question": "a"}, {"question": "b"}], backend=backend)
    warms = [c.prompt for c in backend.calls if c.kind == "warm"]
    assert warms == ["Intro. Q: "] and states.prefix_warm is not None


def test_a_failing_program_does_not_stop_the_batch() -> None:
    def respond(prompt: str, params: GenParams) -> str:
        if "Question: bad" in prompt:
            raise ValueError("nope")
        return "fine"

    states = qa.run_batch(
        [{"question": "good"}, {"question": "bad"}, {"question": "good2"}],
        backend=ScriptedBackend(respond),
    )
    assert states[0]["answer"] == "fine" and states[2]["answer"] == "fine"
    with pytest.raises(rm.ProgramError) as info:
        states[1]["answer"]
    assert isinstance(info.value.__cause__, ValueError)


def test_per_item_and_batch_sampling_defaults() -> None:
    backend = ScriptedBackend(upper)
    qa.run_batch(
        [{"question": "a", "temperature": 0.2}, {"question": "b"}],
        backend=backend,
        temperature=0.0,
        max_new_tokens=5,
    )
    by_question = {c.prompt.split("Question: ")[1][0]: c.params for c in backend.calls_of("gen")}
    assert by_question["a"].temperature == 0.2 and by_question["b"].temperature == 0.0
    assert by_question["a"].max_new_tokens == 5
