"""Compiler mode: tracing programs to graphs, printing them, and executing the graph."""

from __future__ import annotations

import pytest
import radixmesh as rm
from radixmesh.lang.ir import Argument, Fork, Gen, GetForkItem, Join, Text, Variable
from radixmesh.lang.params import GenParams
from radixmesh.lang.scripted import ScriptedBackend


@rm.function
def tips(s: rm.ProgramState, topic: str) -> None:
    """Skeleton-of-thought tip suggestion (paper Figure 14a)."""
    s += "Here are two tips for " + topic + ".\n"
    forks = s.fork(2)
    for i, f in enumerate(forks):
        f += f"Tip {i + 1}:" + rm.gen("tip", max_tokens=8, stop="\n")
    s += "Tip 1:" + forks[0]["tip"] + "\nTip 2:" + forks[1]["tip"] + "\n"
    s += "In summary," + rm.gen("summary")


def respond(prompt: str, params: GenParams) -> str:
    return (
        " sleep well"
        if prompt.endswith("Tip 1:")
        else " eat greens"
        if prompt.endswith("Tip 2:")
        else " rest"
    )


def test_trace_builds_streams_and_nodes() -> None:
    graph = tips.trace()
    assert graph.arguments == ("topic",) and graph.num_streams == 3
    ops = [n.op for n in graph.stream_nodes(0)]
    assert isinstance(ops[0], Text) and isinstance(ops[1], Argument) and isinstance(ops[3], Fork)
    branch = [n.op for n in graph.stream_nodes(1)]
    assert isinstance(branch[0], GetForkItem) and isinstance(branch[2], Gen)
    variables = [n.op for n in graph.nodes if isinstance(n.op, Variable)]
    assert [(v.name, v.stream) for v in variables] == [("tip", 1), ("tip", 2)]


def test_dependencies_cover_intra_and_inter_stream_edges() -> None:
    graph = tips.trace()
    edges = set(graph.dependencies())
    fork = next(n.id for n in graph.nodes if isinstance(n.op, Fork))
    firsts = [graph.stream_nodes(s)[0].id for s in (1, 2)]
    assert {(fork, f) for f in firsts} <= edges
    gen_1 = next(n.id for n in graph.stream_nodes(1) if isinstance(n.op, Gen))
    var_1 = next(n for n in graph.nodes if isinstance(n.op, Variable) and n.op.stream == 1)
    assert (gen_1, var_1.id) in edges and var_1.stream == 0
    assert all(a < b for a, b in edges)  # node order is topological


def test_graph_prints_readably() -> None:
    text = str(tips.trace())
    assert text.startswith("graph tips(topic): ")
    assert "fork -> streams 1, 2" in text
    assert "gen 'tip' {max_new_tokens=8, stop=('\\n',)}" in text
    assert "variable 'tip' of stream 1 <- %" in text


def test_graph_run_matches_the_interpreter() -> None:
    interpreted = tips.run(topic="health", backend=ScriptedBackend(respond)).text()
    backend = ScriptedBackend(respond)
    compiled = tips.trace().run(topic="health", backend=backend)
    assert compiled.text() == interpreted
    assert "Tip 1: sleep well\nTip 2: eat greens\nIn summary, rest" in interpreted
    assert backend.calls[0].kind == "warm"  # forks in graphs send the hint as well


def test_graph_run_checks_arguments() -> None:
    with pytest.raises(TypeError, match="missing arguments"):
        tips.trace().run(backend=ScriptedBackend())


def test_plus_traces_arguments_and_an_fstring_of_one_is_a_type_error() -> None:
    """As in SGLang: an abstract argument has no text to format, so tracing refuses it with a
    TypeError; `+` traces it as a node that the run fills in."""

    @rm.function
    def prog(s: rm.ProgramState, q: str) -> None:
        s += "Q: " + q + "?" + rm.gen("a")

    ops = [n.op for n in prog.trace().nodes]
    assert [type(o) for o in ops] == [Text, Argument, Text, Gen]
    assert prog.trace().run(q="why", backend=ScriptedBackend()).text() == "Q: why?ok"

    @rm.function
    def formatted(s: rm.ProgramState, q: str) -> None:
        s += "Intro.\n"
        s += f"Q: {q}?" + rm.gen("a")

    with pytest.raises(TypeError, match="f-string"):
        formatted.trace()
    with pytest.raises(rm.TracingError):  # also a TracingError, which run_batch expects
        formatted.trace()
    # Running is unaffected (arguments are values then), and run_batch still warms the
    # prefix traced before the f-string, as SGLang's prefix extraction does.
    backend = ScriptedBackend()
    states = formatted.run_batch([{"q": "a"}, {"q": "b"}], backend=backend)
    assert [s.text() for s in states] == ["Intro.\nQ: a?ok", "Intro.\nQ: b?ok"]
    assert backend.calls[0].kind == "warm" and backend.calls[0].prompt == "Intro.\n"


def test_data_dependent_control_flow_cannot_be_traced() -> None:
    @rm.function
    def prog(s: rm.ProgramState) -> None:
        s += rm.select("ok", ["yes", "no"])
        if s["ok"] == "no":
            s += "stop"

    with pytest.raises(rm.TracingError, match="data-dependent"):
        prog.trace()

    @rm.function
    def reads_text(s: rm.ProgramState) -> None:
        s += "x"
        s.text()

    with pytest.raises(rm.TracingError):
        reads_text.trace()


def test_bound_arguments_fix_structure_at_trace_time() -> None:
    @rm.function
    def judge(s: rm.ProgramState, essay: str, dims: list[str]) -> None:
        s += "Essay: " + essay
        forks = s.fork(len(dims))
        for f, d in zip(forks, dims, strict=True):
            f += " " + d + ":" + rm.gen("j")
        forks.join("gather")
        s += " done"

    with pytest.raises(rm.TracingError):
        judge.trace()  # len() of an abstract argument
    graph = judge.trace(dims=["style", "facts"])
    assert graph.arguments == ("essay",)
    assert any(isinstance(n.op, Join) for n in graph.nodes)
    state = graph.run(essay="e", backend=ScriptedBackend())
    assert state["j"] == ["ok", "ok"] and state.text() == "Essay: e done"


def test_constant_prefix_renders_roles_like_the_interpreter() -> None:
    @rm.function
    def chat(s: rm.ProgramState, q: str) -> None:
        s += rm.system("You are terse.")
        s += rm.user("Question: " + q)
        s += rm.assistant(rm.gen("a"))

    backend = ScriptedBackend()
    prefix = chat.trace().constant_prefix(lambda: rm.lang.roles.RoleRenderer(backend.model_info()))
    text = chat.run(q="why", backend=backend).text()
    assert prefix == "<|im_start|>system\nYou are terse.<|im_end|>\n<|im_start|>user\nQuestion: "
    assert text.startswith(prefix)
