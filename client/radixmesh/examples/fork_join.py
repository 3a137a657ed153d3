"""fork / join: branch-solve-merge (the paper's Figure 2, text only).

The prompt is forked into one branch per dimension; branches run in parallel and share the
prefix through the radix cache (the fork hint sends it first). Try --no-hint / --no-parallel
for the paper's frontend ablations.

    python -m radixmesh.examples.fork_join --endpoint localhost:50051
"""

from __future__ import annotations

import time

import radixmesh as rm
from radixmesh.examples._common import backend, parser, report

DIMENSIONS = ["clarity", "originality", "evidence"]


@rm.function
def judge(s: rm.ProgramState, essay: str) -> None:
    s += rm.system("You are a strict but fair essay grader.")
    s += rm.user("Essay:\n" + essay)
    s += rm.assistant("I have read the essay.")
    forks = s.fork(len(DIMENSIONS))
    for f, dim in zip(forks, DIMENSIONS, strict=True):
        f += rm.user("Judge the essay's " + dim + " in one sentence.")
        f += rm.assistant(rm.gen("judgment", max_tokens=48, stop="\n"))
    forks.join("gather")  # s["judgment"] is now the list of branch judgments
    judgments = "\n".join(
        f"- {d}: {j.strip()}" for d, j in zip(DIMENSIONS, s["judgment"], strict=True)
    )
    s += rm.user("Judgments:\n" + judgments + "\nGive a letter grade (A-F) only.")
    s += rm.assistant(rm.gen("grade", max_tokens=4, regex="[A-F][+-]?"))


ESSAY = (
    "Cities should plant more trees. Trees cool streets in summer, absorb rain that "
    "would flood drains, and make people walk more. A city that plants trees saves money."
)


def main() -> None:
    p = parser(__doc__ or "")
    p.add_argument("--no-hint", action="store_true", help="disable the fork hint")
    p.add_argument("--no-parallel", action="store_true", help="run branches one by one")
    args = p.parse_args()
    rm.global_config.enable_fork_hint = not args.no_hint
    rm.global_config.enable_parallelism = not args.no_parallel
    backend(args, lambda prompt, params: "B" if params.regex else "Reasonable.")
    start = time.perf_counter()
    state = judge.run(essay=ESSAY, temperature=0)
    for dim, judgment in zip(DIMENSIONS, state["judgment"], strict=True):
        print(f"{dim:12s} {judgment.strip()}")
    print("grade:", state["grade"], f"({time.perf_counter() - start:.2f}s)")
    report(state.wait())


if __name__ == "__main__":
    main()
