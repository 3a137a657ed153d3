"""fork / join: parallel branches, the frontend hint, join modes, failure propagation."""

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


def echo_dimension(prompt: str, params: GenParams) -> str:
    return " judged " + prompt.rsplit("Judge ", 1)[-1].split(":")[0]


@rm.function
def branch_solve_merge(s: rm.ProgramState, dims: list[str]) -> None:
    s += "Essay: shared context."
    forks = s.fork(len(dims))
    for f, dim in zip(forks, dims, strict=True):
        f += " Judge " + dim + ":" + rm.gen("judgment")
    s += " Verdict:" + "|".join(f["judgment"] for f in forks)


def test_forks_run_in_parallel() -> None:
    # All three branch gens must be inside the backend at once to pass the barrier; run one
    # at a time they would break it (BrokenBarrierError fails the gens).
    barrier = threading.Barrier(3, timeout=5)

    def on_call(call: Call) -> None:
        if call.kind == "gen":
            barrier.wait()

    backend = ScriptedBackend(echo_dimension, on_call=on_call)
    state = branch_solve_merge.run(dims=["a", "b", "c"], backend=backend)
    assert state.text().endswith("Verdict: judged a| judged b| judged c")
    assert backend.max_inflight == 3


def test_fork_hint_is_sent_before_branches() -> None:
    backend = ScriptedBackend(echo_dimension)
    branch_solve_merge.run(dims=["a", "b"], backend=backend).wait()
    kinds = [c.kind for c in backend.calls]
    assert kinds[0] == "warm" and kinds.count("warm") == 1
    warm = backend.calls[0]
    assert warm.prompt == "Essay: shared context." and warm.params.max_new_tokens == 0
    branch_calls = backend.calls[1:3]
    assert all(c.prompt.startswith(warm.prompt) for c in branch_calls)


def test_branches_hit_the_cache_after_the_hint() -> None:
    backend = ScriptedBackend(echo_dimension)
    state = branch_solve_merge.run(dims=["a", "b"], backend=backend).wait()
    # prompt "Essay: shared context." is 3 scripted tokens; both branches reuse them (the
    # later one may also reuse " Judge" from the earlier branch).
    gens = [r for r in state.stats.requests if r.kind == "gen"]
    assert len(gens) == 2 and all(r.cached_tokens >= 3 for r in gens)
    assert state.stats.requests[0].kind == "hint"


def test_no_hint_when_disabled() -> None:
    rm.global_config.enable_fork_hint = False
    backend = ScriptedBackend(echo_dimension)
    branch_solve_merge.run(dims=["a", "b"], backend=backend).wait()
    assert [c.kind for c in backend.calls] == ["gen", "gen"]


def test_no_parallelism_runs_branches_one_at_a_time_in_program_order() -> None:
    rm.global_config.enable_parallelism = False
    backend = ScriptedBackend(echo_dimension)
    state = branch_solve_merge.run(dims=["a", "b", "c"], backend=backend)
    assert state.text().endswith("Verdict: judged a| judged b| judged c")
    assert backend.max_inflight == 1
    assert [c.kind for c in backend.calls] == ["warm", "gen", "gen", "gen"]
    assert [c.prompt[-2:] for c in backend.calls[1:4]] == ["a:", "b:", "c:"]


def test_branch_reads_parent_variables_and_parent_continues_independently() -> None:
    backend = ScriptedBackend({"Q:": " 42", "double:": " 84", "more:": " x"})

    @rm.function
    def prog(s: rm.ProgramState) -> str:
        s += "Q:" + rm.gen("answer")
        (f,) = s.fork(1)
        f += " double:" + rm.gen("double")
        s += " more:" + rm.gen("more")
        return str(f["answer"])  # a branch sees the variables its parent set before the fork

    state = prog.run(backend=backend).wait()
    assert state.text() == "Q: 42 more: x" and state.ret_value == " 42"
    fork_calls = [c for c in backend.calls if c.prompt.endswith("double:")]
    assert fork_calls[0].prompt == "Q: 42 double:"
    assert state["answer"] == " 42"


def test_join_gather_collects_branch_variables_as_lists() -> None:
    backend = ScriptedBackend(echo_dimension)

    @rm.function
    def prog(s: rm.ProgramState) -> None:
        s += "Essay."
        forks = s.fork(2)
        forks += [" Judge x:" + rm.gen("j"), " Judge y:" + rm.gen("j")]
        forks.join("gather")
        s += " done"

    state = prog.run(backend=backend)
    assert state["j"] == [" judged x", " judged y"]
    assert state.text() == "Essay. done"


def test_join_concat_appends_branch_text_in_order() -> None:
    backend = ScriptedBackend(echo_dimension)

    @rm.function
    def prog(s: rm.ProgramState) -> None:
        s += "Essay."
        forks = s.fork(2)
        for f, d in zip(forks, "xy", strict=True):
            f += " Judge " + d + ":" + rm.gen("j")
        forks.join("concat")
        s += " end"

    state = prog.run(backend=backend)
    assert state.text() == "Essay. Judge x: judged x Judge y: judged y end"


def test_joined_branch_cannot_be_extended() -> None:
    @rm.function
    def prog(s: rm.ProgramState) -> None:
        forks = s.fork(2)
        forks.join()
        forks[0] += "late"

    with pytest.raises(rm.ProgramError, match="ended"):
        prog.run(backend=ScriptedBackend())


def test_parent_failure_before_fork_fails_the_branches_with_the_cause() -> None:
    def respond(prompt: str, params: GenParams) -> str:
        if prompt == "boom:":
            raise ConnectionError("server went away")
        return "fine"

    @rm.function
    def prog(s: rm.ProgramState) -> rm.ForkGroup:
        s += "boom:" + rm.gen("first")
        forks = s.fork(2)
        forks += " branch:" + rm.gen("b")
        return forks

    state = prog.run(backend=ScriptedBackend(respond))
    for name, reader in (("first", state), ("b", state.ret_value[1])):
        with pytest.raises(rm.ProgramError) as info:
            reader[name]
        cause = info.value.__cause__
        while cause is not None and not isinstance(cause, ConnectionError):
            cause = cause.__cause__
        assert isinstance(cause, ConnectionError), name


def test_branch_failure_surfaces_at_join_and_its_reads() -> None:
    def respond(prompt: str, params: GenParams) -> str:
        if prompt.endswith("bad:"):
            raise ValueError("bad branch")
        return "ok"

    @rm.function
    def prog(s: rm.ProgramState) -> None:
        s += "ctx"
        forks = s.fork(2)
        forks += [" good:" + rm.gen("v"), " bad:" + rm.gen("v")]
        forks.join("gather")

    state = prog.run(backend=ScriptedBackend(respond))
    with pytest.raises(rm.ProgramError) as info:
        state["v"]
    cause = info.value.__cause__
    while cause is not None and not isinstance(cause, ValueError):
        cause = cause.__cause__
    assert isinstance(cause, ValueError)


def test_failed_fork_hint_does_not_fail_the_program() -> None:
    def on_call(call: Call) -> None:
        if call.kind == "warm":
            raise ConnectionError("hint lost")

    backend = ScriptedBackend(echo_dimension, on_call=on_call)
    state = branch_solve_merge.run(dims=["a", "b"], backend=backend)
    assert state.text().endswith("Verdict: judged a| judged b")
