"""SGLang's frontend API on the DSL (issue 18), against the in-memory ScriptedBackend.

One test per SGLang feature the DSL gained: each runs a program written as for SGLang and
checks the exact prompt text, variables or requests it produces.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Iterator

import pytest
import radixmesh as rm
from radixmesh.lang.params import GenParams
from radixmesh.lang.scripted import ScriptedBackend


@pytest.fixture(autouse=True)
def _restore_default_backend() -> Iterator[None]:
    before = rm.global_config.default_backend
    yield
    rm.set_default_backend(before)


def echo_backend() -> ScriptedBackend:
    """Answers " <last word of the prompt>!" so outputs reveal what the model saw."""
    return ScriptedBackend(lambda prompt, params: " " + prompt.split()[-1] + "!")


def test_forks_index_iadd_and_lambda_iadd_and_sglang_join_modes() -> None:
    @rm.function
    def prog(s: rm.ProgramState) -> None:
        s += "Q:"
        forks = s.fork(3)
        forks += lambda i: f" part{i}"
        for i in range(3):
            forks[i] += rm.gen("x", stop="!")
        forks.join("gather_variable")
        more = s.fork(2)
        more += [" a", " b"]
        more.join("concate_and_append")

    state = prog.run(backend=echo_backend())
    assert state["x"] == [" part0", " part1", " part2"]  # gathered in branch order
    assert state.text() == "Q: a b"


def test_calling_a_program_runs_it_with_positional_or_keyword_arguments() -> None:
    @rm.function
    def qa(s: rm.ProgramState, q1: str, q2: str) -> None:
        s += q1 + " " + q2 + rm.gen("a", stop="!")

    rm.set_default_backend(echo_backend())
    assert qa("one", "two")["a"] == " two"
    assert qa(q1="three", q2="four")["a"] == " four"
    assert qa.bind(q2="five")("six")["a"] == " five"
    with pytest.raises(TypeError):
        qa("a", "b", "c")


def test_a_program_called_on_a_state_is_a_subroutine() -> None:
    @rm.function
    def inner(s: rm.ProgramState, word: str) -> None:
        s += word

    @rm.function
    def outer(s: rm.ProgramState) -> None:
        s += "x"
        inner(s, "y")

    assert outer.run(backend=echo_backend()).text() == "xy"


def test_var_scope_setitem_and_contains() -> None:
    @rm.function
    def prog(s: rm.ProgramState) -> None:
        s += "A "
        with s.var_scope("scoped"):
            s += "B" + rm.gen("g", stop="!")
        s += " C"
        s["given"] = 42

    state = prog.run(backend=echo_backend())
    assert state["scoped"] == "B B"
    assert state["given"] == 42 and "given" in state and "nope" not in state


def test_meta_info_is_sglangs_dict_with_logprobs() -> None:
    @rm.function
    def prog(s: rm.ProgramState) -> None:
        s += "Hello world" + rm.gen("g", max_tokens=1, return_logprob=True, top_logprobs_num=2)

    backend = ScriptedBackend(lambda prompt, params: " there now")
    state = prog.run(backend=backend)
    meta = state.get_meta_info("g")
    assert meta is not None and meta["completion_tokens"] == 1
    assert meta["finish_reason"] == {"type": "length", "length": 1}
    assert meta.get("prompt_length") is None and meta["prompt_tokens"] == 2
    assert backend.calls[-1].params.return_logprob is True


def test_regex_constants_and_dtype() -> None:
    assert re.fullmatch(rm.REGEX_INT, "-42 ") and not re.fullmatch(rm.REGEX_INT, "4.2")
    assert re.fullmatch(rm.REGEX_FLOAT, "3.25") and re.fullmatch(rm.REGEX_STR, '"hi there"')
    assert rm.gen("n", dtype=int).params.regex == rm.REGEX_INT  # type: ignore[attr-defined]
    assert rm.gen_int("n").params.regex == rm.REGEX_INT  # type: ignore[attr-defined]
    assert rm.gen_string("s").params.regex == rm.REGEX_STR  # type: ignore[attr-defined]
    with pytest.raises(ValueError):
        rm.gen("n", dtype=int, regex="[0-9]")


def test_gen_positional_order_is_sglangs() -> None:
    g = rm.gen("a", 16, 4)
    assert g.params.max_new_tokens == 16 and g.params.min_new_tokens == 4  # type: ignore[attr-defined]
    with pytest.raises(ValueError, match="frequency_penalty"):
        rm.gen("a", frequency_penalty=0.5)
    with pytest.raises(ValueError, match="stop_regex"):
        rm.gen("a", stop_regex="x+")


def test_role_begin_end_functions_and_state_role_calls() -> None:
    @rm.function
    def prog(s: rm.ProgramState) -> None:
        s += rm.system_begin() + "S" + rm.system_end()
        s += rm.user_begin() + "U" + rm.user_end()
        s.assistant("A")

    state = prog.run(backend=echo_backend())
    assert state.text() == (
        "<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nU<|im_end|>\n"
        "<|im_start|>assistant\nA<|im_end|>\n"
    )
    assert [m["role"] for m in state.messages()] == ["system", "user", "assistant"]


def test_gen_n_lists_every_sample_and_appends_the_first() -> None:
    @rm.function
    def prog(s: rm.ProgramState) -> None:
        s += "Q" + rm.gen("g", n=3, stop="!")

    backend = echo_backend()
    state = prog.run(backend=backend)
    assert state["g"] == [" Q", " Q", " Q"] and state.text() == "Q Q"
    assert len(backend.calls_of("gen")) == 3


def test_select_choices_methods_and_temperature() -> None:
    def logprob(context: object, token: str) -> float:
        return {" red": -0.1, " green": -2.0, " blue": -1.0}.get(token, -0.5)

    @rm.function
    def prog(s: rm.ProgramState, method: object) -> None:
        s += "Color:" + rm.gen("c", choices=[" red", " green", " blue"], choices_method=method)

    for method in (rm.token_length_normalized, rm.greedy_token_selection):
        state = prog.run(method=method, backend=ScriptedBackend(logprob=logprob))
        assert state["c"] == " red"
        assert state.get_meta_info("c")["normalized_prompt_logprobs"] == pytest.approx(  # type: ignore[index]
            [-0.1, -2.0, -1.0]
        )
    state = prog.run(
        method=rm.unconditional_likelihood_normalized, backend=ScriptedBackend(logprob=logprob)
    )
    assert state["c"] == " red"  # one-token choices: uncond logprob of a first token is 0
    with pytest.raises(ValueError, match="temperature"):
        rm.select("c", ["a"], temperature=0.7)


def test_custom_sglang_choices_method() -> None:
    class Last(rm.ChoicesSamplingMethod):
        def __call__(self, *, choices, **kwargs):  # type: ignore[no-untyped-def, override]
            return rm.ChoicesDecision(choices[-1], {"picked": "last"})

    @rm.function
    def prog(s: rm.ProgramState) -> None:
        s += "X" + rm.select("c", [" a", " b"], choices_method=Last())

    state = prog.run(backend=ScriptedBackend())
    assert state["c"] == " b" and state.get_meta_info("c")["picked"] == "last"  # type: ignore[index]


def test_run_batch_raises_the_bodys_exception_and_rejects_unknown_knobs() -> None:
    @rm.function
    def prog(s: rm.ProgramState, x: int) -> None:
        if x == 1:
            raise RuntimeError("boom in program 1")
        s += "ok" + rm.gen("answer")

    backend = echo_backend()
    with pytest.raises(RuntimeError, match="boom in program 1"):
        prog.run_batch([{"x": 0}, {"x": 1}, {"x": 2}], backend=backend)
    with pytest.raises(TypeError, match="temprature"):
        prog.run_batch([{"x": 0}], backend=backend, temprature=0)
    states = prog.run_batch([(0,), (2,)], backend=backend)
    assert [s["answer"] for s in states] == [" ok!", " ok!"]
    gen = prog.run_batch([{"x": 0}, {"x": 2}], backend=backend, generator_style=True)
    assert not isinstance(gen, list) and [s["answer"] for s in gen] == [" ok!", " ok!"]


def test_default_backend_config_chat_template_cache_compile_and_last_node() -> None:
    backend = echo_backend()
    rm.global_config.default_backend = backend
    assert rm.global_config.default_backend is backend
    template = rm.get_chat_template()
    assert template.get_prefix_and_suffix("user") == ("<|im_start|>user\n", "<|im_end|>\n")
    assert backend.get_chat_template() == template and rm.BaseBackend is rm.BackendBase

    @rm.function
    def prog(s: rm.ProgramState, q: str) -> None:
        s += "A long constant prefix. " + q + rm.gen("a", stop="!")

    warm = prog.cache()
    assert warm is not None and backend.calls[-1].prompt == "A long constant prefix. "
    graph = prog.compile()
    assert graph.last_node is not None and isinstance(graph.last_node.op, rm.lang.ir.Gen)
    assert graph.run(q="Why?").wait()["a"] == " Why?"


def test_a_missing_image_file_is_refused_and_reasoning_is_separated() -> None:
    with pytest.raises(rm.ProgramError, match="cannot read the file"):
        rm.image("no-such-dir/cat.png")

    @rm.function
    def prog(s: rm.ProgramState) -> None:
        s += "Q:" + rm.separate_reasoning(rm.gen("a"), model_type="deepseek-r1")

    backend = ScriptedBackend(lambda prompt, params: "<think> hmm </think> 42")
    state = prog.run(backend=backend)
    assert state["a"] == "42" and state["a_reasoning_content"] == "hmm"
    assert state.text() == "Q:<think> hmm </think> 42"


def test_text_async_iter_and_position_ids_offset() -> None:
    @rm.function
    def prog(s: rm.ProgramState) -> None:
        s += "one two" + rm.gen("g", stop="!")

    async def collect() -> list[str]:
        state = prog.run(backend=echo_backend(), stream=True)
        return [chunk async for chunk in state.text_async_iter()]

    assert "".join(asyncio.run(collect())) == "one two two"

    @rm.function
    def forked(s: rm.ProgramState) -> None:
        s += "P"
        forks = s.fork(2, position_ids_offset=[0, 1])  # accepted and ignored, as SGLang does
        forks += [" a", " b"]
        forks.join("concate_and_append")

    assert forked.run(backend=echo_backend()).text() == "P a b"
    assert forked.trace().num_streams == 3


def test_appending_none_is_an_error() -> None:
    @rm.function
    def prog(s: rm.ProgramState) -> None:
        s += None  # type: ignore[arg-type]

    with pytest.raises(ValueError, match="None"):
        prog.run(backend=echo_backend())


def test_gen_params_carry_logprob_options_into_the_request() -> None:
    params = GenParams(return_logprob=True, top_logprobs_num=3, logprob_start_len=0)
    from radixmesh.lang.gen_exec import logprob_request

    request = logprob_request(params)
    assert request is not None and request.top_logprobs == 3
    assert request.prompt_logprobs_from == 1  # position 0 has no logprob


def test_sglang_forms_trace_and_the_graph_runs_like_the_interpreter() -> None:
    @rm.function
    def prog(s: rm.ProgramState, topic: str) -> None:
        s += "About " + topic + ":"
        forks = s.fork(2)
        forks += lambda i: f" view{i}"
        for i in range(2):
            forks[i] += rm.gen("x", stop="!")
        forks.join("gather_variable")
        with s.var_scope("tail"):
            s += rm.user_begin() + "more" + rm.user_end()

    graph = prog.trace()
    assert "var_scope 'tail' end" in str(graph)
    interpreted = prog.run(topic="cats", backend=echo_backend())
    compiled = graph.run(topic="cats", backend=echo_backend()).wait()
    assert compiled.text() == interpreted.text()
    assert compiled["x"] == interpreted["x"] == [" view0", " view1"]
    assert compiled["tail"] == interpreted["tail"] == "<|im_start|>user\nmore<|im_end|>\n"
