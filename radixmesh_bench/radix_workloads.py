"""`radixmesh bench radix`: RadixAttention on four workloads built from real text.

Workloads (token ids from the model's tokenizer):
- few-shot: two 5-shot prefixes (two subjects), many questions each, arrivals interleaved;
- chat: sessions of 4 turns, each turn's prompt extends the previous prompt + the model's answer;
- tree-of-thought: problems -> approaches -> steps (a root prompt, branches, sub-branches);
- no-reuse: prompts that share nothing (the overhead case).

For each workload: the offline optimal hit rate from the workload's radix tree (Theorem 3.1:
``1 - sum(edge lengths) / sum(prompt tokens)``, at most ``len - 1`` tokens cacheable per prompt;
tokens a request generated count as computed for the later prompts that extend them), a KV pool
of ~40 % of the workload's unique tokens (``--kv-tokens``), and runs with ``--radix tree`` /
``off`` / ``table`` and ``--policy lpm`` / ``fcfs`` / ``random``. Every request of a workload is
submitted at once (chat: every session at once, turns in order), so they queue in the scheduler
and the policy chooses. Each run gets a fresh scheduler process (cold cache) on the same model
process. Reported per run: throughput, achieved hit rate (GetStats), achieved/optimal, radix
bookkeeping per step and as a fraction of wall time.

    radixmesh bench radix [--quick] [--out FILE]     # JSON on stdout, progress on stderr
"""

from __future__ import annotations

import argparse
import contextlib
import os
import platform
import random
import tempfile
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path

from radixmesh.api import Client, GenerateResult

from radixmesh_bench.stack import launcher_for, progress, restart_scheduler, running
from services.launcher import StackPorts, stack_specs

# -- text -------------------------------------------------------------------------------------
GEOGRAPHY_SHOTS = [
    (
        "Which river flows through the city of Cairo?",
        "The Nile",
        "Cairo lies on the banks of the Nile, close to where the river fans out into its delta.",
    ),
    (
        "What is the highest mountain in Africa?",
        "Kilimanjaro",
        "Mount Kilimanjaro in Tanzania rises to about 5,895 metres above sea level.",
    ),
    (
        "Which ocean lies between Africa and Australia?",
        "The Indian Ocean",
        "The Indian Ocean is bounded by Africa to the west and Australia to the east.",
    ),
    (
        "What is the capital city of Canada?",
        "Ottawa",
        "Ottawa, in the province of Ontario, was chosen as the capital in 1857.",
    ),
    (
        "Which desert covers most of northern Africa?",
        "The Sahara",
        "The Sahara is the largest hot desert in the world, spanning eleven countries.",
    ),
]
GEOGRAPHY_QUESTIONS = [
    "Which country has the longest coastline in the world?",
    "What is the capital city of Australia?",
    "Which river is the longest in South America?",
    "On which continent is the Gobi Desert?",
    "What is the largest island in the Mediterranean Sea?",
    "Which strait separates Europe from Africa?",
    "What is the capital city of Kenya?",
    "Which mountain range runs along the border of France and Spain?",
    "In which country is the city of Marrakesh?",
    "Which lake is the deepest in the world?",
    "What is the smallest country in the world by area?",
    "Which sea lies to the north of Turkey?",
    "What is the capital city of Peru?",
    "Which river flows through Budapest and Vienna?",
    "Which country is known as the land of a thousand lakes?",
    "What is the largest country in South America?",
    "Which volcano destroyed the town of Pompeii?",
    "In which ocean are the Maldives?",
    "What is the capital city of Norway?",
    "Which canal connects the Mediterranean Sea to the Red Sea?",
]
CHEMISTRY_SHOTS = [
    (
        "What is the chemical symbol for sodium?",
        "Na",
        "The symbol comes from natrium, the Latin name of the element.",
    ),
    (
        "Which gas makes up most of the air we breathe?",
        "Nitrogen",
        "Dry air is about 78 percent nitrogen and 21 percent oxygen by volume.",
    ),
    (
        "What is the pH of pure water at room temperature?",
        "7",
        "Pure water is neutral: its hydrogen and hydroxide ion concentrations are equal.",
    ),
    (
        "Which element has the atomic number 6?",
        "Carbon",
        "Every carbon atom has six protons in its nucleus.",
    ),
    (
        "What do we call a reaction that releases heat?",
        "Exothermic",
        "Burning wood is a familiar exothermic reaction: it gives off heat and light.",
    ),
]
CHEMISTRY_QUESTIONS = [
    "What is the chemical formula of table salt?",
    "Which metal is liquid at room temperature?",
    "What is the lightest element?",
    "Which gas do plants absorb during photosynthesis?",
    "What is the most abundant element in the Earth's crust?",
    "Which acid is found in the human stomach?",
    "What is the chemical symbol for gold?",
    "How many electrons can the first shell of an atom hold?",
    "What is the name of the process by which a solid turns directly into a gas?",
    "Which element is needed to make steel from iron?",
    "What is the common name for frozen carbon dioxide?",
    "Which noble gas glows red in advertising signs?",
    "What particle has a positive charge in an atom?",
    "Which element gives bones their hardness?",
    "What is the chemical formula of methane?",
    "Which vitamin is made in the skin under sunlight?",
    "What kind of bond holds the two atoms of a hydrogen molecule together?",
    "Which metal rusts when exposed to water and air?",
    "What is the boiling point of water in degrees Fahrenheit at sea level?",
    "Which element is the main component of diamonds?",
]
CHAT_SYSTEM = (
    "You are a patient cooking assistant. Answer in one or two short sentences, "
    "suggest practical substitutions, and mention food safety when it matters."
)
CHAT_OPENERS = [
    "I want to bake bread at home for the first time. What flour should I buy?",
    "How do I cook rice so that it does not stick to the pot?",
    "What is the easiest way to make a tomato soup from scratch?",
    "Can you help me plan a vegetarian dinner for four people?",
    "How long should I boil an egg if I want a runny yolk?",
    "My pancakes always come out flat. What am I doing wrong?",
    "What spices go well with roasted carrots?",
    "How do I keep fresh herbs from wilting in the fridge?",
    "What is a good way to use leftover cooked chicken?",
    "How can I make a simple salad dressing without vinegar?",
    "What should I do if my soup turned out too salty?",
    "How do I know when a steak is medium rare?",
]
CHAT_FOLLOWUPS = [
    "That sounds good. How long will it take?",
    "What can I use instead if I do not have that?",
    "Is there anything I should be careful about?",
]
TOT_PROBLEMS = [
    "A farmer has 17 sheep and all but 9 run away. A neighbour then gives him twice as many "
    "sheep as he has left. How many sheep does the farmer have now? Think step by step.",
    "A train leaves at 9:40 and the journey takes 2 hours and 35 minutes, but it is delayed by "
    "a quarter of an hour on the way. At what time does it arrive? Think step by step.",
    "Three friends share a bill of 84 dollars. One of them pays twice as much as each of the "
    "other two, who pay equal shares. How much does each friend pay? Think step by step.",
]
TOT_APPROACHES = [
    "Approach: write down every quantity given in the problem before doing anything else.",
    "Approach: work backwards from what the question asks for.",
    "Approach: translate each sentence into a small equation and solve them in order.",
    "Approach: estimate a rough answer first, then compute it exactly and compare.",
]
TOT_STEPS = [
    "Step one: identify the unknown and give it a name.",
    "Step two: check the arithmetic of each intermediate result.",
    "Step three: state the final answer in a complete sentence.",
]
NO_REUSE_SENTENCES = [
    "Glaciers carve deep valleys as they slowly slide downhill under their own weight.",
    "Honeybees communicate the direction of flowers through a waggle dance inside the hive.",
    "Medieval cathedrals often took more than a century to complete.",
    "Copper wires carry electricity because their electrons move freely between atoms.",
    "Octopuses can change the colour and texture of their skin in a fraction of a second.",
    "Printing presses spread pamphlets across Europe within weeks of their writing.",
    "Desert plants store water in thick leaves and open their pores only at night.",
    "Lighthouses once relied on oil lamps and polished mirrors to guide ships at night.",
    "Volcanic soil is rich in minerals, which is why farms cluster near active volcanoes.",
    "Chess engines evaluate millions of positions every second before choosing a move.",
    "Salmon return to the river where they hatched, guided partly by smell.",
    "Roman aqueducts moved water for dozens of kilometres using only gravity.",
    "Jazz musicians improvise melodies over a repeating sequence of chords.",
    "Owls can turn their heads much further than most other birds.",
    "Early photographs required the subject to stay still for several minutes.",
    "Bamboo is among the fastest growing plants and can rise almost a metre in a day.",
    "Sailors measured their speed by counting knots on a rope paid out behind the ship.",
    "Tea was first drunk as a medicine before it became an everyday drink.",
    "Hummingbirds beat their wings so fast that they appear as a blur.",
    "Suspension bridges hang their decks from cables draped over tall towers.",
    "Coral reefs are built by tiny animals that deposit limestone skeletons.",
    "Kites were used in ancient China to send signals across long distances.",
    "Maple syrup is made by boiling down the sap collected in early spring.",
    "Penguins huddle together in winter, taking turns on the cold outer edge.",
    "Clockmakers used springs and escapements to keep time without a pendulum.",
    "Wolves travel in packs led by a breeding pair and their grown offspring.",
    "Paper money first appeared in China more than a thousand years ago.",
    "Snowflakes form six-sided crystals because of the shape of water molecules.",
    "Windmills ground grain and pumped water long before they generated electricity.",
    "Crows can recognise individual human faces and remember them for years.",
    "Silk is spun by caterpillars that wrap themselves in a single long thread.",
    "Tides rise and fall twice a day as the Moon pulls on the oceans.",
]


def few_shot_prefix(subject: str, shots: Sequence[tuple[str, str, str]]) -> str:
    parts = [
        f"The following are questions about {subject}, each with a short answer and an "
        "explanation.\n\n"
    ]
    for q, a, why in shots:
        parts.append(f"Question: {q}\nAnswer: {a}. {why}\n\n")
    return "".join(parts)


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


# -- the stack -------------------------------------------------------------------------------------
class BenchStack:
    """One model process (KV sized per workload) and a fresh scheduler process per run."""

    def __init__(self, kv_tokens: int, log_dir: Path, model: str = "default") -> None:
        self.ports = StackPorts.free()
        self.launcher = launcher_for(
            stack_specs(self.ports, model, model_args=["--kv-tokens", str(kv_tokens)]), log_dir
        )
        self._running = contextlib.ExitStack()  # holds the stack while it runs
        self.base_args = list(self.launcher.specs["scheduler"].args)
        self.endpoint = f"127.0.0.1:{self.ports.tokenizer}"
        self.started = False

    def use_scheduler(self, args: Sequence[str]) -> None:
        """Start the stack with scheduler flags `args`, or restart only the scheduler with them
        (radixmesh_bench.stack: the benches' one starter)."""
        if not self.started:
            self.launcher.specs["scheduler"].args = [*self.base_args, *args]
            self._running.enter_context(running(self.launcher, timeout=600))
            self.started = True
            return
        restart_scheduler(self.launcher, [*self.base_args, *args], timeout=120)

    def stop(self) -> None:
        self._running.close()
        self.started = False


# -- running ---------------------------------------------------------------------------------
def _gen(c: Client, ids: list[int], max_new: int) -> GenerateResult:
    return c.generate(input_ids=ids, max_new_tokens=max_new, temperature=0, ignore_eos=True)


def run_workload(
    endpoint: str, w: Workload, concurrency: int
) -> tuple[list[list[int]], list[list[int]], int, float]:
    """Submit every request (chat: every session) at once. Returns (prompts, what each left in
    the KV cache, output tokens, wall seconds)."""
    prompts: list[list[int]] = []
    computed: list[list[int]] = []
    out_tokens = 0
    with Client(endpoint) as c:
        t0 = time.perf_counter()
        if not w.is_chat:
            with ThreadPoolExecutor(min(concurrency, len(w.prompts))) as pool:
                results = list(pool.map(lambda p: _gen(c, p, w.max_new), w.prompts))
            for p, r in zip(w.prompts, results, strict=True):
                prompts.append(p)
                computed.append(p + r.output_ids[:-1])
                out_tokens += r.completion_tokens
        else:

            def session(
                first: list[int], followups: list[list[int]]
            ) -> list[tuple[list[int], list[int]]]:
                done, p = [], list(first)
                for k in range(len(followups) + 1):
                    r = _gen(c, p, w.max_new)
                    done.append((p, r.output_ids))
                    if k < len(followups):
                        p = p + r.output_ids + followups[k]
                return done

            with ThreadPoolExecutor(min(concurrency, len(w.sessions))) as pool:
                turns = list(pool.map(lambda s: session(*s), w.sessions))
            for sess in turns:
                for p, out in sess:
                    prompts.append(p)
                    computed.append(p + out[:-1])
                    out_tokens += len(out)
        wall = time.perf_counter() - t0
    return prompts, computed, out_tokens, wall


@dataclass(frozen=True)
class RunConfig:
    """One scheduler configuration; ``eviction``/``protect_ms`` empty: the scheduler default."""

    radix: str
    policy: str = "lpm"
    eviction: str = ""
    protect_ms: str = ""

    def args(self) -> list[str]:
        out = ["--radix", self.radix, "--policy", self.policy]
        if self.eviction:
            out += ["--eviction", self.eviction]
        if self.protect_ms:
            out += ["--protect-ms", self.protect_ms]
        return out


def parse_configs(specs: Sequence[str]) -> list[RunConfig]:
    """``RADIX[:POLICY[:EVICTION[:PROTECT_MS]]]``, e.g. ``tree:lpm:lfu:0``, ``off``."""
    out = []
    for spec in specs:
        parts = spec.split(":")
        if not 1 <= len(parts) <= 4:
            raise ValueError(f"bad config {spec!r}")
        parts += [""] * (4 - len(parts))
        out.append(RunConfig(parts[0], parts[1] or "lpm", parts[2], parts[3]))
    return out


CONFIGS = parse_configs(["tree:lpm", "off", "table", "tree:fcfs", "tree:random"])
QUICK_CONFIGS = parse_configs(["tree:lpm", "off", "tree:fcfs"])


def run_config(
    stack: BenchStack, w: Workload, cfg: RunConfig, concurrency: int, extra: Sequence[str]
) -> dict:
    stack.use_scheduler([*cfg.args(), *extra])
    with Client(stack.endpoint) as c:
        _gen(c, [1, 2, 3, 4], 1)  # warm-up through the new scheduler (excluded by deltas)
        s0 = c.stats()
        prompts, computed, out_tokens, wall = run_workload(stack.endpoint, w, concurrency)
        s1 = c.stats()
    opt = optimal_hit_rate(prompts, computed)
    dp = s1.prompt_tokens - s0.prompt_tokens
    dc = s1.cached_prompt_tokens - s0.cached_prompt_tokens
    steps = s1.steps - s0.steps
    radix_s = s1.radix_seconds - s0.radix_seconds
    hit = dc / dp if dp else 0.0
    return {
        "radix": cfg.radix,
        "policy": cfg.policy,
        "eviction": cfg.eviction or "default",
        "protect_ms": cfg.protect_ms or "default",
        "requests": len(prompts),
        "wall_s": round(wall, 2),
        "output_tokens": out_tokens,
        "output_tok_s": round(out_tokens / wall, 2),
        "prompt_tokens": dp,
        "cached_prompt_tokens": dc,
        "hit_rate": round(hit, 4),
        "optimal_hit_rate": round(opt["optimal_hit_rate"], 4),
        "achieved_over_optimal": round(hit / opt["optimal_hit_rate"], 4)
        if opt["optimal_hit_rate"]
        else None,
        "evicted_tokens": s1.evicted_tokens - s0.evicted_tokens,
        "retractions": s1.retractions - s0.retractions,
        "steps": steps,
        "radix_ms_per_step": round(1e3 * radix_s / steps, 4) if steps else 0.0,
        "radix_fraction_of_wall": round(radix_s / wall, 6),
    }


def run(ns: argparse.Namespace) -> dict:
    from transformers import AutoTokenizer

    from services.model_store import resolve_model

    folder = resolve_model(ns.model)
    tok = AutoTokenizer.from_pretrained(folder)

    def encode(text: str) -> list[int]:
        return list(tok.encode(text, add_special_tokens=False))

    workloads = build_workloads(encode, quick=ns.quick, max_new=ns.max_new)
    if ns.only:
        workloads = [w for w in workloads if w.name in ns.only]
    configs = parse_configs(ns.configs) if ns.configs else QUICK_CONFIGS if ns.quick else CONFIGS
    report: dict = {
        "bench": "radix_workloads",
        "model": folder.name,
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version()},
        "settings": {
            "max_new_tokens": ns.max_new,
            "kv_fraction": ns.kv_fraction,
            "concurrency": ns.concurrency,
            "quick": ns.quick,
        },
        "workloads": {},
    }
    t_all = time.perf_counter()
    for w in workloads:
        prompts, full = w.planned()
        unique = unique_tokens(full)
        longest = max(len(f) for f in full)
        kv = max(int(unique * ns.kv_fraction), longest + 16)
        plan = optimal_hit_rate(prompts, [f[:-1] for f in full])
        entry: dict = {
            "requests": len(prompts),
            "prompt_tokens": plan["prompt_tokens"],
            "unique_tokens": unique,
            "kv_tokens": kv,
            "kv_fraction": round(kv / unique, 3),
            "optimal_hit_rate_planned": round(plan["optimal_hit_rate"], 4),
            "runs": [],
        }
        progress(
            f"{w.name}: {len(prompts)} requests, {plan['prompt_tokens']} prompt tokens, "
            f"{unique} unique, KV {kv} tokens, optimal {plan['optimal_hit_rate']:.3f}"
        )
        stack = BenchStack(kv, Path(tempfile.mkdtemp(prefix=f"radix-bench-{w.name}-")), ns.model)
        try:
            for cfg in configs:
                progress(f"  {w.name}: {' '.join(cfg.args())}")
                r = run_config(stack, w, cfg, ns.concurrency, ns.sched_arg)
                progress(
                    f"    hit {r['hit_rate']:.3f} (optimal {r['optimal_hit_rate']:.3f}), "
                    f"{r['output_tok_s']} tok/s, {r['wall_s']} s"
                )
                entry["runs"].append(r)
        finally:
            stack.stop()
        report["workloads"][w.name] = entry
    report["total_s"] = round(time.perf_counter() - t_all, 1)
    return report


def add_parser(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser("radix", help="radix cache: hit rate vs optimal, policies, overhead")
    p.add_argument("--model", default="default")
    p.add_argument("--quick", action="store_true", help="smaller workloads, 3 configurations")
    p.add_argument("--max-new", type=int, default=8, help="output tokens per request")
    p.add_argument(
        "--kv-fraction",
        type=float,
        default=0.4,
        help="KV capacity as a fraction of the workload's unique tokens",
    )
    p.add_argument("--concurrency", type=int, default=64, help="most requests in flight")
    p.add_argument("--only", nargs="*", default=[], help="workload names to run")
    p.add_argument(
        "--configs",
        nargs="*",
        default=[],
        help="RADIX[:POLICY[:EVICTION[:PROTECT_MS]]] runs instead of the default set "
        "(e.g. tree:lpm off tree:lpm:lfu:0; omitted parts: lpm and the scheduler defaults)",
    )
    p.add_argument(
        "--sched-arg",
        action="append",
        default=[],
        help="extra scheduler flag for every run (repeatable)",
    )
    p.add_argument("--out", default="", help="also write the JSON here")

    def main(ns: argparse.Namespace) -> int:
        from radixmesh_bench.report import emit_report

        return emit_report(run(ns), ns.out)

    p.set_defaults(func=main)
