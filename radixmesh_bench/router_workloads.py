"""Workloads of `radixmesh bench router`: token-count controlled, seeded, deterministic.

Prompts are random token ids (not text), so every length is exact and the sharing structure is
exactly the one built here; ids come from `ID_RANGE`, clear of the special tokens of both the
default model (SmolLM2: ids < 20) and the Llama-3 vocabulary (>= 128000). Each workload is a
`radix_workloads.Workload` (static prompts in arrival order, or chat sessions), so the radix
bench's offline-optimum arithmetic applies unchanged.

- `gsp` (generated shared prefix, as SGLang's bench_serving): `groups` system prompts of
  `system_tokens`, each followed by `questions` distinct questions of `question_tokens`;
  arrivals shuffled across groups.
- `chat`: conversations sharing one system prompt; each turn's prompt is the previous turn's
  prompt + the model's answer + a new user message of `turn_tokens`.
- `few_shot`: one block of `shots` examples (`shot_tokens` each) shared by every request, then a
  distinct question.
- `uniform`: distinct prompts sharing nothing: the load-balance check.
- `skewed`: `hot_fraction` of the requests share one hot prefix; the rest are distinct prompts
  of the same length. Arrivals shuffled.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass, fields, replace

from radixmesh_bench.radix_workloads import Workload

ID_RANGE = (1000, 30000)  # [lo, hi): ordinary tokens of every supported vocabulary
WORKLOADS = ("gsp", "chat", "few_shot", "uniform", "skewed")


@dataclass(frozen=True)
class Sizes:
    """Every size of every workload; `--scale` picks a preset, `--<field>` flags override."""

    max_new_tokens: int
    gsp_groups: int
    gsp_questions: int
    gsp_system_tokens: int
    gsp_question_tokens: int
    chat_conversations: int
    chat_turns: int
    chat_system_tokens: int
    chat_turn_tokens: int
    few_shot_shots: int
    few_shot_shot_tokens: int
    few_shot_questions: int
    few_shot_question_tokens: int
    uniform_requests: int
    uniform_tokens: int
    skewed_requests: int
    skewed_hot_fraction: float
    skewed_prefix_tokens: int
    skewed_suffix_tokens: int

    def __post_init__(self) -> None:
        for f in fields(self):
            if getattr(self, f.name) < 0:
                raise ValueError(f"{f.name} must not be negative")
        if not 0.0 <= self.skewed_hot_fraction <= 1.0:
            raise ValueError("skewed_hot_fraction must be within [0, 1]")
        if self.chat_turns < 1 or self.max_new_tokens < 1:
            raise ValueError("chat_turns and max_new_tokens must be at least 1")


SCALES: dict[str, Sizes] = {
    # A CPU smoke run of the small model: minutes for the whole matrix on a laptop.
    "small": Sizes(4, 4, 4, 128, 16, 4, 3, 32, 16, 4, 32, 8, 16, 16, 64, 16, 0.75, 128, 16),
    # The CPU measurement of issue 16 (SmolLM2-135M).
    "medium": Sizes(8, 8, 8, 512, 32, 8, 4, 64, 32, 5, 64, 32, 32, 64, 256, 64, 0.8, 512, 32),
    # GPU runs (random Llama weights): SGLang's GSP defaults are 64 x 16, 2048 + 128 tokens.
    "large": Sizes(
        64, 32, 16, 2048, 128, 32, 6, 256, 128, 8, 256, 128, 64, 512, 1024, 512, 0.8, 2048, 128
    ),
}


def sizes_for(scale: str, **overrides: float | None) -> Sizes:
    """The `scale` preset with the given fields replaced (None values are ignored)."""
    if scale not in SCALES:
        raise ValueError(f"unknown scale {scale!r}; choose one of {', '.join(SCALES)}")
    given = {k: v for k, v in overrides.items() if v is not None}
    return replace(SCALES[scale], **given)  # type: ignore[arg-type]


class _Ids:
    """Random token ids from one seeded generator: the same seed gives the same workload."""

    def __init__(self, seed: int) -> None:
        self.rng = random.Random(seed)

    def __call__(self, n: int) -> list[int]:
        lo, hi = ID_RANGE
        return [self.rng.randrange(lo, hi) for _ in range(n)]


def gsp(s: Sizes, seed: int) -> Workload:
    ids = _Ids(seed)
    prompts = []
    for _ in range(s.gsp_groups):
        system = ids(s.gsp_system_tokens)
        prompts += [system + ids(s.gsp_question_tokens) for _ in range(s.gsp_questions)]
    ids.rng.shuffle(prompts)
    return Workload("gsp", s.max_new_tokens, prompts=prompts)


def chat(s: Sizes, seed: int) -> Workload:
    ids = _Ids(seed)
    system = ids(s.chat_system_tokens)
    sessions = []
    for _ in range(s.chat_conversations):
        first = system + ids(s.chat_turn_tokens)
        sessions.append((first, [ids(s.chat_turn_tokens) for _ in range(s.chat_turns - 1)]))
    return Workload("chat", s.max_new_tokens, sessions=sessions)


def few_shot(s: Sizes, seed: int) -> Workload:
    ids = _Ids(seed)
    block = [t for _ in range(s.few_shot_shots) for t in ids(s.few_shot_shot_tokens)]
    prompts = [block + ids(s.few_shot_question_tokens) for _ in range(s.few_shot_questions)]
    return Workload("few_shot", s.max_new_tokens, prompts=prompts)


def uniform(s: Sizes, seed: int) -> Workload:
    ids = _Ids(seed)
    prompts = [ids(s.uniform_tokens) for _ in range(s.uniform_requests)]
    return Workload("uniform", s.max_new_tokens, prompts=prompts)


def skewed(s: Sizes, seed: int) -> Workload:
    ids = _Ids(seed)
    hot = ids(s.skewed_prefix_tokens)
    n_hot = round(s.skewed_requests * s.skewed_hot_fraction)
    prompts = [hot + ids(s.skewed_suffix_tokens) for _ in range(n_hot)]
    length = s.skewed_prefix_tokens + s.skewed_suffix_tokens
    prompts += [ids(length) for _ in range(s.skewed_requests - n_hot)]
    ids.rng.shuffle(prompts)
    return Workload("skewed", s.max_new_tokens, prompts=prompts)


_BUILDERS = {"gsp": gsp, "chat": chat, "few_shot": few_shot, "uniform": uniform, "skewed": skewed}


def build(names: Sequence[str], sizes: Sizes, seed: int = 0) -> list[Workload]:
    """The named workloads in the order given; workload i of WORKLOADS uses seed*100 + i, so
    dropping one from the list never changes another."""
    out = []
    for name in names:
        if name not in _BUILDERS:
            raise ValueError(f"unknown workload {name!r}; choose from {', '.join(WORKLOADS)}")
        out.append(_BUILDERS[name](sizes, seed * 100 + WORKLOADS.index(name)))
    return out
