"""Roles: a multi-turn chat rendered from the server's role markers, streamed as it runs.

python -m radixmesh.examples.chat --endpoint localhost:50051
"""

from __future__ import annotations

import radixmesh as rm
from radixmesh.examples._common import backend, parser, report


@rm.function
def tutor(s: rm.ProgramState, questions: list[str]) -> None:
    s += rm.system("You are a concise physics tutor.")
    for i, question in enumerate(questions):
        s += rm.user(question)
        with s.assistant():  # the context-manager form of rm.assistant(...)
            s += rm.gen(f"answer_{i}", max_tokens=64)


def main() -> None:
    args = parser(__doc__ or "").parse_args()
    backend(args)
    questions = ["Why is the sky blue?", "And why are sunsets red?"]
    state = tutor.run(questions=questions, temperature=0, stream=True)
    for chunk in state.text_iter():
        print(chunk, end="", flush=True)
    print()
    for message in state.messages():
        print(f"{message['role']:>9}: {message['content'][:60]!r}")
    report(state)


if __name__ == "__main__":
    main()
