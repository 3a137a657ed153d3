"""The workloads of `radixmesh bench radix` (radix_bench.py runs them) and their radix-tree
arithmetic.

Workloads (token ids from the model's tokenizer, text from radix_texts.py):
- few-shot: two 5-shot prefixes (two subjects), many questions each, arrivals interleaved;
- chat: sessions of 4 turns, each turn's prompt extends the previous prompt + the model's answer;
- tree-of-thought: problems -> approaches -> steps (a root prompt, branches, sub-branches);
- no-reuse: prompts that share nothing (the overhead case).

For each workload: the offline optimal hit rate from the workload's radix tree (Theorem 3.1:
``1 - sum(edge lengths) / sum(prompt tokens)``, at most ``len - 1`` tokens cacheable per prompt;
tokens a request generated count as computed for the later prompts that extend them).
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from radixmesh_bench.radix_texts import (
    CHAT_FOLLOWUPS,
    CHAT_OPENERS,
    CHAT_SYSTEM,
    CHEMISTRY_QUESTIONS,
    CHEMISTRY_SHOTS,
    GEOGRAPHY_QUESTIONS,
    GEOGRAPHY_SHOTS,
    NO_REUSE_SENTENCES,
    TOT_APPROACHES,
    TOT_PROBLEMS,
    TOT_STEPS,
    few_shot_prefix,
)

# -- workloads -----------------------------------------------------------------------------------
Encode = Callable[[str], list[int]]


@dataclass
class Workload:
    """Static requests (prompt ids in arrival order) or chat sessions (``sessions``: the first
    prompt and the follow-up ids appended after each answer)."""

    name: str
    max_new: int
    prompts: list[list[int]] = field(default_factory=list)
    sessions: list[tuple[list[int], list[list[int]]]] = field(default_factory=list)

    @property
    def is_chat(self) -> bool:
        return bool(self.sessions)

    def planned(self) -> tuple[list[list[int]], list[list[int]]]:
        """(prompts, prompts + outputs) with stand-in outputs (ids < 0, distinct per request):
        the workload's shape before any output exists, for sizing the KV pool."""
        fake = iter(range(-1, -(10**9), -1))
        if not self.is_chat:
            full = [p + [next(fake) for _ in range(self.max_new)] for p in self.prompts]
            return list(self.prompts), full
        prompts, full = [], []
        for first, followups in self.sessions:
            p = list(first)
            for k in range(len(followups) + 1):
                out = [next(fake) for _ in range(self.max_new)]
                prompts.append(p)
                full.append(p + out)
                if k < len(followups):
                    p = p + out + followups[k]
        return prompts, full


def interleave(groups: Sequence[Sequence[list[int]]]) -> list[list[int]]:
    out: list[list[int]] = []
    for i in range(max(len(g) for g in groups)):
        out.extend(g[i] for g in groups if i < len(g))
    return out


def build_workloads(encode: Encode, quick: bool = False, max_new: int = 8) -> list[Workload]:
    nq = 10 if quick else 20
    geo = encode(few_shot_prefix("world geography", GEOGRAPHY_SHOTS))
    chem = encode(few_shot_prefix("basic chemistry", CHEMISTRY_SHOTS))
    geo_q = [geo + encode(f"Question: {q}\nAnswer:") for q in GEOGRAPHY_QUESTIONS[:nq]]
    chem_q = [chem + encode(f"Question: {q}\nAnswer:") for q in CHEMISTRY_QUESTIONS[:nq]]
    few = Workload("few_shot", max_new, prompts=interleave([geo_q, chem_q]))

    system = encode(f"System: {CHAT_SYSTEM}\n")
    sessions = []
    for opener in CHAT_OPENERS[: 6 if quick else 12]:
        first = system + encode(f"User: {opener}\nAssistant:")
        follow = [encode(f"\nUser: {f}\nAssistant:") for f in CHAT_FOLLOWUPS]
        sessions.append((first, follow))
    chat = Workload("multi_turn_chat", max_new, sessions=sessions)

    trees = []
    for problem in TOT_PROBLEMS[: 2 if quick else 3]:
        root = encode(f"Problem: {problem}\n")
        level: list[list[int]] = [root]
        for a in TOT_APPROACHES[: 3 if quick else 4]:
            branch = root + encode(f"{a}\n")
            level.append(branch)
            level.extend(branch + encode(f"{s}\n") for s in TOT_STEPS)
        trees.append(level)
    rng = random.Random(7)
    for t in trees:  # arrivals: a shuffled tree, round-robin over the problems
        rng.shuffle(t)
    tot = Workload("tree_of_thought", max_new, prompts=interleave(trees))

    n = len(NO_REUSE_SENTENCES)
    norm = []
    for i in range(n if not quick else n // 2):
        order = [NO_REUSE_SENTENCES[(i + k * 7) % n] for k in range(4)]
        norm.append(encode(" ".join(order)))
    noreuse = Workload("no_reuse", max_new, prompts=norm)
    return [few, chat, tot, noreuse]


# -- radix-tree arithmetic -------------------------------------------------------------------------
def lcp(a: Sequence[int], b: Sequence[int]) -> int:
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


def unique_tokens(seqs: Sequence[Sequence[int]]) -> int:
    """Tokens in the radix tree of ``seqs`` (sum of its edge lengths)."""
    total, prev = 0, None
    for s in sorted({tuple(s) for s in seqs}):
        total += len(s) - (lcp(s, prev) if prev is not None else 0)
        prev = s
    return total


def optimal_hit_rate(
    prompts: Sequence[Sequence[int]], computed: Sequence[Sequence[int]]
) -> dict[str, float]:
    """Offline optimum with an unbounded cache, visiting the radix tree depth first (Thm 3.1).

    ``computed[i]`` is what request ``i`` (prompt ``prompts[i]``) leaves in the KV cache: its
    prompt + output minus the last sampled token. In sorted order a prefix precedes its
    extensions, which is a DFS order, and the longest prefix shared with anything visited before
    is shared with the predecessor. Each prompt takes ``min(len - 1, that prefix)`` from the
    cache; for prompts only this equals ``1 - sum(edge lengths) / sum(prompt tokens)`` with the
    ``len - 1`` cap.
    """
    items = [(tuple(c), 0) for c, p in zip(computed, prompts, strict=True) if len(c) > len(p)]
    items += [(tuple(p), 1) for p in prompts]
    items.sort()
    cached = total = 0
    prev: tuple[int, ...] | None = None
    for seq, is_prompt in items:
        if is_prompt:
            total += len(seq)
            if prev is not None:
                cached += min(len(seq) - 1, lcp(seq, prev))
        prev = seq
    edges = unique_tokens(list(prompts) + list(computed)) if computed else unique_tokens(prompts)
    return {
        "optimal_hit_rate": cached / total if total else 0.0,
        "optimal_cached_tokens": cached,
        "prompt_tokens": total,
        "radix_tree_tokens": edges,
    }
