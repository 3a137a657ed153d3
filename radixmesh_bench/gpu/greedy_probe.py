"""Greedy outputs of a running stack on fixed prompts, as JSON, so two configurations (TP1 and
TP2, say) can be compared token by token afterwards:

    python radixmesh_bench/gpu/greedy_probe.py --endpoint localhost:50051 --out tp2.json
    python radixmesh_bench/gpu/greedy_probe.py --compare tp1.json tp2.json

The prompts are random ids below 128000 from a fixed seed (the same on every run), 8 of
them with 64 to 512 tokens; 64 new tokens each, greedy, ignore_eos. The comparison prints the
agreement rate and, per prompt, the first position where the two differ and A's margin there
(top-1 minus top-2 logprob). bf16 random weights have near-ties: a divergence at a margin
within bf16's rounding (NEAR_TIE) is expected of two correct configurations, one at a wide
margin is a bug; fp32 with the reference attention must agree exactly."""

from __future__ import annotations

import argparse
import json
import random
import sys
from pathlib import Path

NEW = 64
# bf16 keeps 8 significant bits: logits of size ~10 round by ~0.04, so two configurations that
# sum in a different order (TP's all-reduce) can swap tokens whose logprobs differ by this much.
NEAR_TIE = 0.1


def prompts() -> list[list[int]]:
    rng = random.Random(1)
    return [[rng.randrange(128000) for _ in range(64 * (1 + i))] for i in range(8)]


def probe(endpoint: str) -> dict[str, list[list[float]] | list[list[int]]]:
    """Per prompt: the greedy ids and, per token, the top-1 minus top-2 logprob."""
    from radixmesh.api import Client

    ids: list[list[int]] = []
    margins: list[list[float]] = []
    with Client(endpoint, timeout=600) as c:
        for p in prompts():
            r = c.generate(
                input_ids=p,
                max_new_tokens=NEW,
                ignore_eos=True,
                temperature=0,
                return_logprob=True,
                top_logprobs=2,
            )
            ids.append(r.output_ids)
            margins.append([_margin(t.top) for t in r.output_logprobs])
    return {"ids": ids, "margins": margins}


def _margin(top: list[tuple[int, float]]) -> float:
    return top[0][1] - top[1][1] if len(top) >= 2 else float("inf")


def compare(a: dict | list, b: dict | list) -> dict[str, object]:
    """Agreement of B with A; a file of an older probe is a bare list of ids (no margins)."""
    ia, ib = (x["ids"] if isinstance(x, dict) else x for x in (a, b))
    ma = a.get("margins") if isinstance(a, dict) else None
    same = sum(x == y for ra, rb in zip(ia, ib, strict=True) for x, y in zip(ra, rb, strict=True))
    total = sum(len(r) for r in ia)
    first = [
        next((i for i, (x, y) in enumerate(zip(ra, rb, strict=True)) if x != y), len(ra))
        for ra, rb in zip(ia, ib, strict=True)
    ]
    out: dict[str, object] = {"agreement": same / total, "first_divergence": first, "tokens": total}
    if ma is not None:
        at = [round(m[i], 4) for m, i, r in zip(ma, first, ia, strict=True) if i < len(r)]
        out["margin_at_divergence"] = at
        out["wide_divergences"] = sum(m > NEAR_TIE for m in at)  # > 0: not rounding
    return out


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
    if ns.out:
        ns.out.write_text(json.dumps(out))
    ids = out["ids"]
    print(f"probe: {len(ids)} prompts, {sum(map(len, ids))} tokens", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
