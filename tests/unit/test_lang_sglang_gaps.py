"""The behaviours SGLang programs needed that the DSL lacked (issue 33), from SGLang's semantics:

- `trace().last_node.print_graph_dfs()` prints the nodes the last node depends on, in order;
- `backend.token_usage` sums the prompt and completion tokens of the requests programs made,
  also under API speculative execution (one call fills several gens);
- `gen(max_tokens=0, return_logprob=True, top_logprobs_num=k, return_text_in_logprobs=True)`
  appends nothing and reports the next-token distribution's top k as `output_top_logprobs[0]`;
- a program called without a state while another is traced is traced through (SGLang's
  `test_multi_function`), and the compiled graph runs it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import radixmesh as rm
from radixmesh.lang.backend import LogprobRequest, TokenLogprob
from radixmesh.lang.ir import SubProgram
from radixmesh.lang.params import GenParams
from radixmesh.lang.scripted import ScriptedBackend


def test_print_graph_dfs_of_the_last_node() -> None:
    @rm.function
    def few_shot_qa(s: rm.ProgramState, prompt: str, question: str) -> None:
        s += prompt
        s += "Q: " + question + "\n"
        s += "A:" + rm.gen("answer", stop="\n")

    graph = few_shot_qa.bind(prompt="Answer briefly.\n").trace()
    assert graph.last_node is not None
    printed = graph.last_node.print_graph_dfs()
    assert printed == (
        "%0 = text 'Answer briefly.\\n'\n"
        "%1 = %0 + text 'Q: '\n"
        "%2 = %1 + argument question\n"
        "%3 = %2 + text '\\n'\n"
        "%4 = %3 + text 'A:'\n"
        "%5 = %4 + gen 'answer' {stop=('\\n',)}\n"
    )


def test_print_graph_dfs_follows_forks_and_variables_only_where_they_lead() -> None:
    @rm.function
    def tips(s: rm.ProgramState) -> None:
        s += "Tips:"
        forks = s.fork(2)
        forks += rm.gen("tip", max_tokens=4)
        s += "First:" + forks[0]["tip"]

    graph = tips.trace()
    printed = graph.last_node.print_graph_dfs() if graph.last_node else ""
    lines = printed.splitlines()
    # the second branch's gen (%5) is not read by the last node; the first's (%4) is
    assert lines == [
        "%0 = text 'Tips:'",
        "%1 = %0 + fork -> streams 1, 2",
        "%2 = get_fork_item %1[0]",
        "%4 = %2 + gen 'tip' {max_new_tokens=4}",
        "%6 = %1 + text 'First:'",
        "%7 = %6 + variable 'tip' of stream 1 <- %4",
    ]


@rm.function(num_api_spec_tokens=32)
def character(s: rm.ProgramState) -> None:
    s += "Name: Ann.\nBirthday: May 1.\nPlease write another.\n"
    s += "Name:" + rm.gen("name", stop="\n") + "\nBirthday:" + rm.gen("birthday", stop="\n")


def test_token_usage_after_api_speculative_execution() -> None:
    backend = ScriptedBackend({"Name:": " Bob\nBirthday: June 2\nJob: chef\n"})
    state = character.run(backend=backend)
    assert (state["name"], state["birthday"]) == (" Bob", " June 2")
    calls = backend.calls
    assert len(calls) == 1  # one call served both gens
    served = len(backend.tokenize(" Bob\nBirthday: June 2\nJob: chef\n"))
    usage = backend.token_usage
    assert usage.prompt_tokens == len(backend.tokenize(calls[0].prompt))
    assert usage.completion_tokens == served
    character.run(backend=backend).wait()  # totals accumulate over runs, as SGLang's do
    assert usage.completion_tokens == 2 * served
    usage.reset()
    assert (usage.prompt_tokens, usage.completion_tokens) == (0, 0)


class NextTokenBackend(ScriptedBackend):
    """Answers like the runtime: one sampled token whose top alternatives come back."""

    TOP = ((11, -0.5), (12, -1.25), (13, -2.0))

    def __init__(self) -> None:
        super().__init__()
        self.sent: list[tuple[GenParams, LogprobRequest | None]] = []

    def generate(
        self,
        prompt: Any,
        params: GenParams,
        *,
        logprobs: LogprobRequest | None = None,
        on_text: Any = None,
    ) -> rm.Completion:
        self.sent.append((params, logprobs))
        k = logprobs.top_logprobs if logprobs else 0
        return rm.Completion(
            text=" Paris",
            output_ids=(11,),
            finish_reason="length",
            prompt_tokens=5,
            completion_tokens=1,
            output_logprobs=(TokenLogprob(11, -0.5, self.TOP[:k]),),
        )

    def detokenize(self, ids: Sequence[int]) -> str:
        return {11: " Paris", 12: " Lyon", 13: " the"}[ids[0]]


def test_gen_max_tokens_zero_reports_the_next_token_top_k() -> None:
    @rm.function
    def top_k(s: rm.ProgramState) -> None:
        s += "The capital of France is"
        s += rm.gen(
            "next",
            max_tokens=0,
            return_logprob=True,
            top_logprobs_num=2,
            return_text_in_logprobs=True,
        )

    backend = NextTokenBackend()
    state = top_k.run(backend=backend, temperature=0.7, stop="\n")
    assert state["next"] == "" and state.text() == "The capital of France is"
    meta = state.get_meta_info("next")
    assert meta is not None
    assert meta["output_top_logprobs"][0] == [(-0.5, 11, " Paris"), (-1.25, 12, " Lyon")]
    assert meta["output_token_logprobs"] == [] and meta["completion_tokens"] == 0
    ((params, logprobs),) = backend.sent
    # the probe: one greedy token nothing can stop first, its top 2 asked for
    assert (params.max_new_tokens, params.temperature, params.ignore_eos) == (1, 0.0, True)
    assert params.stop == () and logprobs is not None and logprobs.top_logprobs == 2
    assert state.stats.completion_tokens() == 1  # what the server served is still counted


def test_a_plain_max_tokens_zero_gen_only_prefills() -> None:
    backend = NextTokenBackend()

    @rm.function
    def warm_only(s: rm.ProgramState) -> None:
        s += "Hello" + rm.gen("x", max_tokens=0)

    warm_only.run(backend=backend).wait()
    ((params, logprobs),) = backend.sent
    assert params.max_new_tokens == 0 and logprobs is None  # no probe without top logprobs


@rm.function
def expand(s: rm.ProgramState, tip: str) -> None:
    s += "Expand: " + tip + "\n"
    s += rm.gen("detailed_tip", max_tokens=8, stop="\n")


@rm.function
def tip_suggestion(s: rm.ProgramState, topic: str) -> None:
    s += "Two tips for " + topic + ".\n"
    s += "1." + rm.gen("tip_1", stop="\n") + "\n"
    s += "2." + rm.gen("tip_2", stop="\n") + "\n"
    branch1 = expand(tip=s["tip_1"])
    branch2 = expand(tip=s["tip_2"])
    s += "Tip 1:" + branch1["detailed_tip"] + "\n"
    s += "Tip 2:" + branch2["detailed_tip"] + "\n"


def _responses() -> dict[str, str]:
    return {
        "1.": " Sleep\n",
        "2.": " Walk\n",
        "Expand:  Sleep\n": " Eight hours.\n",
        "Expand:  Walk\n": " Daily steps.\n",
    }


def test_a_called_program_is_traced_through_and_the_graph_runs_it() -> None:
    graph = tip_suggestion.compile()
    calls = [n for n in graph.nodes if isinstance(n.op, SubProgram)]
    assert [(c.op.name, c.stream) for c in calls] == [("expand", 1), ("expand", 2)]
    assert graph.num_streams == 3 and graph.arguments == ("topic",)

    compiled = graph.run(topic="health", backend=ScriptedBackend(_responses())).wait()
    # Interpreted, `expand(tip=...)` is a run of its own on the default backend (SGLang's).
    previous = rm.global_config.default_backend
    rm.set_default_backend(ScriptedBackend(_responses()))
    try:
        interpreted = tip_suggestion.run(topic="health")
        text = interpreted.text()
    finally:
        rm.set_default_backend(previous)
    expected = "Two tips for health.\n1. Sleep\n2. Walk\nTip 1: Eight hours.\nTip 2: Daily steps.\n"
    assert compiled.text() == text == expected
    batch = graph.run_batch([{"topic": "a"}, {"topic": "b"}], backend=ScriptedBackend(_responses()))
    assert [s.text().splitlines()[0] for s in batch] == ["Two tips for a.", "Two tips for b."]
