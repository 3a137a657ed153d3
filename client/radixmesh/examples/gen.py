"""gen: generate text into a variable, with max tokens and stop strings.

python -m radixmesh.examples.gen --endpoint localhost:50051
"""

from __future__ import annotations

import radixmesh as rm
from radixmesh.examples._common import backend, parser, report


@rm.function
def capital(s: rm.ProgramState, country: str) -> None:
    s += "Q: What is the capital of " + country + "?\nA:"
    s += rm.gen("answer", max_tokens=16, stop=["\n", "."])
    s += "\nQ: And its population, roughly?\nA:"
    s += rm.gen("population", max_tokens=24, stop="\n")


def main() -> None:
    args = parser(__doc__ or "").parse_args()
    backend(args)
    state = capital.run(country="France", temperature=0)
    print("answer:    ", state["answer"].strip())
    print("population:", state["population"].strip())
    meta = state.get_meta_info("population").source  # the Completion behind SGLang's dict
    if isinstance(meta, rm.Completion):  # the 2nd call reuses the 1st call's KV cache
        print(f"2nd call: {meta.cached_tokens}/{meta.prompt_tokens} prompt tokens cached")
    report(state)


if __name__ == "__main__":
    main()
