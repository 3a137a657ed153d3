"""The paper's Figure 2 essay judge (text only) written with the plain client library.

This is the "OpenAI-API-style" half of the lines-of-code comparison in docs/dsl_results.md.
Everything the DSL does for a program is done by hand here: chat roles are rendered from the
model's markers, the prompt string is carried along and extended manually, the dimensions run
on threads, and `select` is computed from prompt-token logprobs. The DSL half is
`multi_dimensional_judge` in tests/integration/test_dsl_live.py; that test checks that both
versions produce the same prompt, judgments, summary and grade at temperature 0.

    python -m radixmesh.examples.figure2_plain --endpoint localhost:50051
"""

from __future__ import annotations

import argparse
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from radixmesh.api import DEFAULT_ENDPOINT, Client

DIMENSIONS = ["clarity", "originality", "evidence"]
GRADES = [" A", " B", " C", " D"]
ESSAY = (
    "Cities should plant more trees. Trees cool streets in summer, absorb rain that "
    "would flood drains, and make people walk more. A city that plants trees saves money."
)


@dataclass
class Judgment:
    related: str
    judgments: list[str]
    summary: str
    grade: str
    text: str  # the whole final prompt, as the DSL's s.text() would show it


def multi_dimensional_judge(c: Client, essay: str) -> Judgment | None:
    roles = c.model_info().roles

    def turn(role: str, content: str) -> str:
        return roles[role].prefix + content + roles[role].suffix

    def gen(prompt: str, stop: str, max_new_tokens: int) -> str:
        return c.generate(prompt, temperature=0, stop=[stop], max_new_tokens=max_new_tokens).text

    def select(prompt: str, choices: list[str]) -> str:
        # Score each choice by the mean logprob of its tokens after the prompt.
        start = len(c.tokenize(prompt, add_special_tokens=True))

        def score(choice: str) -> float:
            res = c.generate(prompt + choice, max_new_tokens=0, prompt_logprobs_from=start)
            return sum(t.logprob for t in res.prompt_logprobs) / len(res.prompt_logprobs)

        with ThreadPoolExecutor(len(choices)) as pool:
            scores = list(pool.map(score, choices))
        return choices[scores.index(max(scores))]

    prompt = turn("system", "Evaluate an essay about trees in cities.")
    prompt += turn("user", "Essay: " + essay) + turn("assistant", "Sure!")
    prompt += turn("user", "Is the essay related to trees?")
    related = select(prompt + roles["assistant"].prefix, ["yes", "no"])
    prompt += turn("assistant", related)
    if related == "no":
        return None

    def judge(dim: str) -> str:
        question = (
            "Evaluate the essay's " + dim + " in one sentence. "
            "End your judgment with the word 'END'"
        )
        branch = prompt + turn("user", question) + roles["assistant"].prefix + "Judgment:"
        return gen(branch, "END", 32)

    with ThreadPoolExecutor(len(DIMENSIONS)) as pool:
        judgments = list(pool.map(judge, DIMENSIONS))
    judgment = "\n".join(judgments)
    prompt += turn("user", "Provide the judgment, summary, and a letter grade")
    prompt += roles["assistant"].prefix + judgment + "\nIn summary,"
    summary = gen(prompt, ".", 32)
    prompt += summary + ". The grade of it is"
    grade = select(prompt, GRADES)
    prompt += grade + roles["assistant"].suffix
    return Judgment(related, judgments, summary, grade, prompt)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--endpoint", default=DEFAULT_ENDPOINT)
    args = p.parse_args()
    with Client(args.endpoint, timeout=120) as c:
        result = multi_dimensional_judge(c, ESSAY)
    if result is None:
        print("the essay is not related to the topic")
        return
    for dim, text in zip(DIMENSIONS, result.judgments, strict=True):
        print(f"{dim:12s} {text.strip()}")
    print("summary:", result.summary.strip())
    print("grade:  ", result.grade.strip())


if __name__ == "__main__":
    main()
