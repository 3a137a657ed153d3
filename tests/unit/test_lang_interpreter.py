"""Interpreter mode: op ordering, asynchronous submission, variable waits, errors, streaming."""

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


def counter_backend() -> ScriptedBackend:
    """Each gen answers with its own sequence number: g0, g1, ..."""
    n = iter(range(1000))
    return ScriptedBackend(lambda prompt, params: f" g{next(n)}")


def test_ops_run_in_submission_order_and_prompts_accumulate() -> None:
    backend = counter_backend()

    @rm.function
    def prog(s: rm.ProgramState, topic: str) -> None:
        s += "About " + topic + ":"
        s += rm.gen("a") + " then" + rm.gen("b")
        s += " end"

    state = prog.run(topic="cats", backend=backend)
    assert state.text() == "About cats: g0 then g1 end"
    assert (state["a"], state["b"]) == (" g0", " g1")
    prompts = [c.prompt for c in backend.calls_of("gen")]
    assert prompts == ["About cats:", "About cats: g0 then"]


def test_submission_does_not_block_and_reads_wait() -> None:
    started, release = threading.Event(), threading.Event()

    def respond(prompt: str, params: GenParams) -> str:
        started.set()
        assert release.wait(5)
        return "done"

    backend = ScriptedBackend(respond)

    @rm.function
    def prog(s: rm.ProgramState) -> None:
        s += "Q:" + rm.gen("x")
        s += " after"  # queued behind the gen; must not block the program

    state = prog.run(backend=backend)  # returns while the gen is still running
    assert started.wait(5)
    future = state._executor.var_future("x")
    assert not future.done()
    got: list[str] = []
    reader = threading.Thread(target=lambda: got.append(state["x"]))
    reader.start()
    assert not future.done() and not got  # the reader is parked on the variable
    release.set()
    reader.join(5)
    assert got == ["done"]
    assert state.text() == "Q:done after"


def test_reading_a_failed_variable_raises_with_the_cause() -> None:
    def respond(prompt: str, params: GenParams) -> str:
        if prompt.endswith("bad:"):
            raise ValueError("model exploded")
        return "fine"

    @rm.function
    def prog(s: rm.ProgramState) -> None:
        s += "good:" + rm.gen("ok")
        s += " bad:" + rm.gen("broken")
        s += " later:" + rm.gen("skipped")

    state = prog.run(backend=ScriptedBackend(respond))
    assert state["ok"] == "fine"  # produced before the failure: still readable
    with pytest.raises(rm.ProgramError, match="gen 'broken' failed") as info:
        state["broken"]
    assert isinstance(info.value.__cause__, ValueError)
    with pytest.raises(rm.ProgramError, match="not run: gen 'broken' failed") as info:
        state["skipped"]
    assert isinstance(info.value.__cause__, ValueError)
    with pytest.raises(rm.ProgramError) as info:
        state.text()
    assert isinstance(info.value.__cause__, ValueError)
    assert isinstance(state.error(), ValueError)


def test_unknown_variable_is_a_key_error() -> None:
    @rm.function
    def prog(s: rm.ProgramState) -> None:
        s += "x"

    with pytest.raises(KeyError):
        prog.run(backend=ScriptedBackend())["nope"]


def test_program_exception_is_raised_by_run() -> None:
    @rm.function
    def prog(s: rm.ProgramState) -> None:
        s += "x"
        raise RuntimeError("user bug")

    with pytest.raises(RuntimeError, match="user bug"):
        prog.run(backend=ScriptedBackend())


def test_sampling_defaults_merge_under_gen_params() -> None:
    backend = ScriptedBackend()

    @rm.function
    def prog(s: rm.ProgramState, temperature: str) -> None:
        s += temperature + rm.gen("a", max_tokens=3) + rm.gen("b", temperature=0.5)

    state = prog.run(temperature="T", backend=backend, max_new_tokens=7, top_p=0.9)
    state.text()
    first, second = (c.params for c in backend.calls_of("gen"))
    assert backend.calls_of("gen")[0].prompt == "T"  # program argument, not a sampling knob
    assert (first.max_new_tokens, first.top_p, first.temperature) == (3, 0.9, None)
    assert (second.max_new_tokens, second.temperature) == (7, 0.5)


def test_stop_strings_and_regex_reach_the_backend() -> None:
    backend = ScriptedBackend(lambda p, params: "12 apples. more")

    @rm.function
    def prog(s: rm.ProgramState) -> None:
        s += "n=" + rm.gen("n", stop=["."], regex=r"\d+ apples")

    state = prog.run(backend=backend)
    assert state["n"] == "12 apples"
    params = backend.calls_of("gen")[0].params
    assert params.stop == (".",) and params.regex == r"\d+ apples"
    meta = state.get_meta_info("n")
    assert isinstance(meta.source, rm.Completion) and meta.matched_stop == "."
    assert meta["finish_reason"] == {"type": "stop", "matched": "."}


def test_text_iter_streams_gen_chunks_in_order() -> None:
    backend = ScriptedBackend(lambda p, params: " one two three")

    @rm.function
    def prog(s: rm.ProgramState) -> None:
        s += "Count:"
        s += rm.gen("c")
        s += "!"

    state = prog.run(backend=backend, stream=True)
    chunks = list(state.text_iter())
    assert chunks == ["Count:", " one", " two", " three", "!"]
    assert list(state.text_iter("c")) == [" one", " two", " three"]
    assert state.text() == "Count: one two three!"


def test_text_iter_raises_after_a_failing_program_body() -> None:
    @rm.function
    def prog(s: rm.ProgramState) -> None:
        s += "a"
        raise RuntimeError("late bug")

    state = prog.run(backend=ScriptedBackend(), stream=True)
    with pytest.raises(rm.ProgramError) as info:
        list(state.text_iter())
    assert isinstance(info.value.__cause__, RuntimeError)


def test_without_parallelism_ops_run_on_the_caller_thread() -> None:
    rm.global_config.enable_parallelism = False
    threads: list[str] = []
    backend = ScriptedBackend(on_call=lambda call: threads.append(threading.current_thread().name))

    @rm.function
    def prog(s: rm.ProgramState) -> None:
        s += "x" + rm.gen("a")
        assert backend.calls  # already executed: submission is synchronous
        s += rm.gen("b")

    prog.run(backend=backend).text()
    assert threads == [threading.current_thread().name] * 2


def test_subprogram_call_shares_the_state() -> None:
    @rm.function
    def inner(s: rm.ProgramState, word: str) -> None:
        s += " " + word

    @rm.function
    def outer(s: rm.ProgramState) -> str:
        s += "a"
        inner(s, "b")
        return "ret"

    state = outer.run(backend=ScriptedBackend())
    assert state.text() == "a b" and state.ret_value == "ret"


def test_appending_unsupported_values_fails_at_the_call_site() -> None:
    @rm.function
    def prog(s: rm.ProgramState) -> None:
        s += 5  # type: ignore[arg-type]

    with pytest.raises(TypeError):
        prog.run(backend=ScriptedBackend())


def test_program_stats_sum_cached_tokens() -> None:
    backend = ScriptedBackend(lambda p, params: " fine")

    @rm.function
    def prog(s: rm.ProgramState) -> None:
        s += "one two three" + rm.gen("a") + " four" + rm.gen("b")

    state = prog.run(backend=backend).wait()
    second = [c for c in backend.calls if c.kind == "gen"][1]
    assert isinstance(second, Call)
    # The second prompt extends the first prompt + output, which the cache holds.
    assert state.cached_tokens == 4 and state.prompt_tokens == 3 + 5
    assert state.stats.cache_hit_rate("gen") == pytest.approx(4 / 8)
