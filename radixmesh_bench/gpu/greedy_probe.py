"""Greedy outputs of a running stack on fixed prompts, as JSON, so two configurations (TP1 and
TP2, say) can be compared token by token afterwards:

    python radixmesh_bench/gpu/greedy_probe.py --endpoint localhost:50051 --out tp2.json
    python radixmesh_bench/gpu/greedy_probe.py --compare tp1.json tp2.json

The prompts are random ids below 128000 from a fixed seed (the same on every run), 8 of
them with 64 to 512 tokens; 64 new tokens each, greedy, ignore_eos. The comparison prints the
agreement rate and, per prompt, the first position where the two differ (bf16 random weights
have near-ties: a divergence after one is expected; fp32 with the reference attention must
agree exactly)."""

from __future__ import annotations

import argparse
import json
import random
import sys
from pathlib import Path

NEW = 64


def prompts() -> list[list[int]]:
    rng = random.Random(1)
    return [[rng.randrange(128000) for _ in range(64 * (1 + i))] for i in range(8)]


def probe(endpoint: str) -> list[list[int]]:
    from radixmesh.api import Client

    with Client(endpoint, timeout=600) as c:
        return [
            c.generate(input_ids=p, max_new_tokens=NEW, ignore_eos=True, temperature=0).output_ids
            for p in prompts()
        ]


def compare(a: list[list[int]], b: list[list[int]]) -> dict[str, object]:
    same = sum(x == y for ra, rb in zip(a, b, strict=True) for x, y in zip(ra, rb, strict=True))
    total = sum(len(r) for r in a)
    first = [
        next((i for i, (x, y) in enumerate(zip(ra, rb, strict=True)) if x != y), len(ra))
        for ra, rb in zip(a, b, strict=True)
    ]
    return {"agreement": same / total, "first_divergence": first, "tokens": total}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--endpoint", default="localhost:50051")
    ap.add_argument("--out", type=Path)
    ap.add_argument("--compare", nargs=2, type=Path, metavar=("A", "B"))
    ns = ap.parse_args(argv)
    if ns.compare:
        a, b = (json.loads(p.read_text()) for p in ns.compare)
        print(json.dumps(compare(a, b)))
        return 0
    out = probe(ns.endpoint)
    text = json.dumps(out)
    if ns.out:
        ns.out.write_text(text)
    print(f"probe: {len(out)} prompts, {sum(map(len, out))} tokens", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
