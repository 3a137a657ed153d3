"""run_batch: many program instances at once, sharing a few-shot prefix via the radix cache.

The program's constant prefix (found by tracing) is warmed once before the batch. Use
--no-hint / --no-parallel for the frontend ablations and compare the cache hit rates.

    python -m radixmesh.examples.run_batch --endpoint localhost:50051 -n 32
"""

from __future__ import annotations

import time

import radixmesh as rm
from radixmesh.examples._common import backend, parser

FEW_SHOT = (
    "Answer each arithmetic question with a number.\n"
    "Q: 2 + 2\nA: 4\nQ: 10 - 3\nA: 7\nQ: 6 * 7\nA: 42\n"
)


@rm.function
def arithmetic(s: rm.ProgramState, a: int, b: int) -> None:
    s += FEW_SHOT
    s += f"Q: {a} + {b}\nA:" + rm.gen("answer", max_tokens=6, stop="\n")


def scripted_sum(prompt: str, params: rm.GenParams) -> str:
    """Offline stand-in for the model: answers the last "Q: a + b" correctly."""
    a, b = prompt.rsplit("Q: ", 1)[1].split("\n")[0].split(" + ")
    return f" {int(a) + int(b)}\n"


def main() -> None:
    p = parser(__doc__ or "")
    p.add_argument("-n", type=int, default=16, help="number of programs")
    p.add_argument("--threads", type=int, default=0, help="0 = auto")
    p.add_argument("--no-hint", action="store_true")
    p.add_argument("--no-parallel", action="store_true")
    args = p.parse_args()
    rm.global_config.enable_fork_hint = not args.no_hint
    rm.global_config.enable_parallelism = not args.no_parallel
    backend(args, scripted_sum)
    batch = [{"a": i, "b": 2 * i + 1} for i in range(args.n)]
    start = time.perf_counter()
    states = arithmetic.run_batch(
        batch, num_threads=args.threads or "auto", progress_bar=True, temperature=0
    )
    elapsed = time.perf_counter() - start
    correct = sum(
        s["answer"].strip() == str(x["a"] + x["b"]) for s, x in zip(states, batch, strict=True)
    )
    print(f"{correct}/{len(batch)} correct in {elapsed:.2f}s")
    print(
        f"cache hit rate {states.cache_hit_rate():.1%} "
        f"({states.cached_tokens()}/{states.prompt_tokens()} prompt tokens)"
    )


if __name__ == "__main__":
    main()
