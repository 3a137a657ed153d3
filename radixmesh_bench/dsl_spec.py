"""API speculative execution, measured: calls and prompt tokens with and without it.

Runs the SGLang paper's section-5 example (a character sheet filled by three short gens)
against any OpenAI-compatible completions endpoint, once as a plain program and once with
`@function(num_api_spec_tokens=N)`, and prints JSON:

    python -m radixmesh_bench.dsl_spec --base-url http://127.0.0.1:8000/v1 --model NAME

Calls and prompt tokens are what the server reported per request (`usage.prompt_tokens`);
`chars_sent` is the prompt text sent, which needs no server support at all.
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

import radixmesh as rm
from radixmesh.lang.backend import Completion, LogprobRequest, Prompt, TextCallback
from radixmesh.lang.params import GenParams


def character(s: Any, name_hint: str) -> None:
    s += "Construct a character within the following format:\n"
    s += "Name: Steve Jobs.\nBirthday: February 24, 1955.\nJob: Apple CEO.\n"
    s += "\nPlease generate new Name, Birthday and Job.\n" + name_hint
    s += "Name:" + rm.gen("name", stop="\n") + "\nBirthday:" + rm.gen("birthday", stop="\n")
    s += "\nJob:" + rm.gen("job", stop="\n") + "\n"


class CountingBackend(rm.OpenAIBackend):
    """Counts what goes over the wire (thread-safe)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._lock = threading.Lock()
        self.calls = 0
        self.chars_sent = 0

    def generate(
        self,
        prompt: Prompt,
        params: GenParams,
        *,
        logprobs: LogprobRequest | None = None,
        on_text: TextCallback | None = None,
    ) -> Completion:
        with self._lock:
            self.calls += 1
            self.chars_sent += len(prompt) if isinstance(prompt, str) else 0
        return super().generate(prompt, params, logprobs=logprobs, on_text=on_text)


@dataclass(frozen=True)
class Measurement:
    programs: int
    calls: int
    prompt_tokens: int
    completion_tokens: int
    chars_sent: int
    outputs: list[dict[str, str]]


def measure(
    base_url: str, model: str, *, spec_tokens: int | None, hints: Sequence[str], api_key: str
) -> Measurement:
    backend = CountingBackend(model, base_url, api_key, is_chat_model=False)
    program = rm.function(character, num_api_spec_tokens=spec_tokens)
    prompt_tokens = completion_tokens = 0
    outputs = []
    for hint in hints:
        state = program.run(name_hint=hint, backend=backend, temperature=0, max_new_tokens=32)
        state.wait()
        outputs.append({k: state[k] for k in ("name", "birthday", "job")})
        prompt_tokens += state.stats.prompt_tokens()
        completion_tokens += state.stats.completion_tokens()
    return Measurement(
        len(hints), backend.calls, prompt_tokens, completion_tokens, backend.chars_sent, outputs
    )


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base-url", required=True, help="e.g. http://127.0.0.1:8000/v1")
    parser.add_argument("--model", required=True)
    parser.add_argument("--api-key", default="none")
    parser.add_argument("--spec-tokens", type=int, default=64)
    parser.add_argument("--programs", type=int, default=4)
    args = parser.parse_args(argv)
    hints = [f"Character {i + 1}.\n" for i in range(args.programs)]
    common = {"hints": hints, "api_key": args.api_key}
    plain = measure(args.base_url, args.model, spec_tokens=None, **common)
    spec = measure(args.base_url, args.model, spec_tokens=args.spec_tokens, **common)
    report = {
        "program": "paper section 5: character sheet, 3 gens with stop='\\n'",
        "base_url": args.base_url,
        "model": args.model,
        "num_api_spec_tokens": args.spec_tokens,
        "without_speculation": asdict(plain),
        "with_speculation": asdict(spec),
        "calls_ratio": plain.calls / spec.calls if spec.calls else None,
        "prompt_tokens_ratio": (
            plain.prompt_tokens / spec.prompt_tokens if spec.prompt_tokens else None
        ),
        "chars_sent_ratio": plain.chars_sent / spec.chars_sent if spec.chars_sent else None,
    }
    json.dump(report, sys.stdout, indent=2)
    sys.stdout.write("\n")
    return report


if __name__ == "__main__":
    main()
