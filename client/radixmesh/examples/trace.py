"""Compiler mode: trace a program into a graph, print it, and run the graph.

python -m radixmesh.examples.trace --endpoint localhost:50051
"""

from __future__ import annotations

import radixmesh as rm
from radixmesh.examples._common import backend, parser, report


@rm.function
def tip_suggestion(s: rm.ProgramState, topic: str) -> None:
    """Skeleton-of-thought tips (the paper's Figure 14a)."""
    s += "Here are two tips for " + topic + ":\n1. Balanced diet.\n2. Regular exercise.\n"
    forks = s.fork(2)
    for i, f in enumerate(forks):
        f += f"Now, expand tip {i + 1} into a detailed paragraph:\n"
        f += rm.gen("detailed_tip", max_tokens=64, stop="\n\n")
    s += "Tip 1:" + forks[0]["detailed_tip"] + "\n"
    s += "Tip 2:" + forks[1]["detailed_tip"] + "\n"
    s += "In summary," + rm.gen("summary", max_tokens=48, stop="\n")


def main() -> None:
    args = parser(__doc__ or "").parse_args()
    backend(args)
    graph = tip_suggestion.trace()
    print(graph)
    print("edges:", graph.dependencies())
    state = graph.run(topic="staying healthy", temperature=0)
    print("\nsummary: In summary," + state["summary"])
    report(state.wait())


if __name__ == "__main__":
    main()
