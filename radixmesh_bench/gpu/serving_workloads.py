"""Request lists and floors for the serving parts (`sharegpt`, `gsp`, `mmlu`); pure, no I/O
beyond reading the committed ShareGPT sample, no torch.

- ShareGPT: the committed sample (`radixmesh_bench/gpu/sample_sharegpt.py` wrote it): real prompt
  ids
  and real output lengths, EOS ignored.
- generated-shared-prefix (SGLang's `bench_serving --dataset-name generated-shared-prefix`):
  `groups` system prompts of `system_len` random ids, `per_group` questions of `question_len`
  random ids each, prompt = system + question, `output_len` new tokens; question i belongs to
  group i // per_group and the list is shuffled with the seed, as bench_serving does by default.
- MMLU-style 5-shot: per subject a shared few-shot prefix (a header and 5 worked examples, each
  a question, 4 choices and its answer) and many questions (question + 4 choices + "Answer:"),
  1 new token each. Lengths are drawn per subject / question from ranges near MMLU's; the
  content is random ids (random weights make the text irrelevant; only the shape matters for
  the cache). Arrival order is shuffled across subjects.

Random ids are drawn below 128000 (ordinary Llama-3.1 tokens; specials start there).
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from radixmesh_bench.radix_workloads import lcp

VOCAB_TEXT = 128000


@dataclass(frozen=True)
class Req:
    ids: list[int]
    max_new: int
    group: int = -1  # shared-prefix group (gsp, mmlu); -1 when none


@dataclass(frozen=True)
class GspSpec:
    groups: int = 64
    per_group: int = 16
    system_len: int = 2048
    question_len: int = 128
    output_len: int = 256
    seed: int = 1


@dataclass(frozen=True)
class MmluSpec:
    subjects: int = 16
    questions: int = 64  # per subject
    shot_len: tuple[int, int] = (100, 260)  # one worked example: question, choices, answer
    header_len: int = 16  # "The following are multiple choice questions about ..."
    question_len: tuple[int, int] = (40, 200)  # question + choices + "Answer:"
    shots: int = 5
    seed: int = 2


GSP_QUICK = GspSpec(groups=4, per_group=4, system_len=64, question_len=16, output_len=8)
MMLU_QUICK = MmluSpec(
    subjects=3, questions=6, shot_len=(12, 20), header_len=4, question_len=(6, 12)
)


def _ids(rng: random.Random, n: int) -> list[int]:
    return [rng.randrange(VOCAB_TEXT) for _ in range(n)]


def gsp_requests(spec: GspSpec = GspSpec()) -> list[Req]:
    rng = random.Random(spec.seed)
    systems = [_ids(rng, spec.system_len) for _ in range(spec.groups)]
    reqs = [
        Req(
            systems[i // spec.per_group] + _ids(rng, spec.question_len),
            spec.output_len,
            i // spec.per_group,
        )
        for i in range(spec.groups * spec.per_group)
    ]
    rng.shuffle(reqs)
    return reqs


def mmlu_requests(spec: MmluSpec = MmluSpec()) -> list[Req]:
    rng = random.Random(spec.seed)
    reqs = []
    for s in range(spec.subjects):
        prefix = _ids(rng, spec.header_len)
        for _ in range(spec.shots):
            prefix += _ids(rng, rng.randint(*spec.shot_len))
        reqs += [
            Req(prefix + _ids(rng, rng.randint(*spec.question_len)), 1, s)
            for _ in range(spec.questions)
        ]
    rng.shuffle(reqs)
    return reqs


def sharegpt_requests(
    doc: dict[str, Any], limit: int | None = None, max_output: int | None = None
) -> list[Req]:
    """The sample's requests in order; `limit` takes the first n, `max_output` caps output
    lengths (quick CPU runs only)."""
    n = len(doc["prompt_ids"]) if limit is None else min(limit, len(doc["prompt_ids"]))
    cap = max_output or 1 << 30
    return [Req(list(doc["prompt_ids"][i]), min(int(doc["output_lens"][i]), cap)) for i in range(n)]


def default_sample_path() -> Path:
    return Path(__file__).resolve().parents[1] / "data" / "sharegpt_2000.json.gz"


# -- offline optimum ----------------------------------------------------------------------------
def optimal_hit_rate(prompts: Sequence[Sequence[int]]) -> float:
    """Best hit rate any order can reach with an unbounded cache (Theorem 3.1: visit the
    prompts' radix tree depth first): in sorted order each prompt takes from the cache its
    longest common prefix with its predecessor, at most len - 1 tokens (the last prompt token
    is always computed, for its logits). Outputs extend no later prompt in these workloads."""
    order = sorted(tuple(p) for p in prompts)
    total = sum(len(p) for p in order)
    cached = sum(min(len(p) - 1, lcp(p, q)) for q, p in zip(order, order[1:], strict=False))
    return cached / total if total else 0.0


# -- floors -------------------------------------------------------------------------------------
def model_bytes(cfg: dict[str, Any], dtype_bytes: int = 2) -> dict[str, float]:
    """Byte and FLOP constants of a Llama config (random_configs.config_dict): weights a decode
    step reads (all but the embedding table, of which it reads a row per token), KV bytes per
    token, and matmul parameters per token (2 FLOPs each)."""
    h, i, n = cfg["hidden_size"], cfg["intermediate_size"], cfg["num_hidden_layers"]
    hd = cfg.get("head_dim") or h // cfg["num_attention_heads"]
    q, kv = cfg["num_attention_heads"] * hd, cfg["num_key_value_heads"] * hd
    layer = h * (q + 2 * kv) + q * h + 3 * h * i + 2 * h
    head = 0 if cfg.get("tie_word_embeddings") else cfg["vocab_size"] * h
    matmul = n * (h * (q + 2 * kv) + q * h + 3 * h * i) + cfg["vocab_size"] * h
    return {
        "step_weight_bytes": float((n * layer + h + head) * dtype_bytes),
        "kv_bytes_per_token": float(2 * n * kv * dtype_bytes),
        "matmul_params_per_token": float(matmul),
    }


def floors(
    consts: dict[str, float],
    reqs: Sequence[Req],
    cached: int,
    steps: int,
    copy_gbps: float,
    matmul_tflops: float,
) -> dict[str, float]:
    """Lower bounds on the run's time for the steps the scheduler took.

    bandwidth: every step reads the weights once, every decode token reads its context's KV
    (prompt + tokens so far); compute: prompt tokens not served from cache cost 2 FLOPs per
    matmul parameter (attention FLOPs left out, so the bound stays a bound). Either limit alone
    is a floor, so the run's floor is the larger one."""
    kv = sum(
        r.max_new * len(r.ids) + r.max_new * (r.max_new - 1) / 2 for r in reqs if r.max_new > 1
    )
    bw_s = (steps * consts["step_weight_bytes"] + kv * consts["kv_bytes_per_token"]) / (
        copy_gbps * 1e9
    )
    computed = sum(len(r.ids) for r in reqs) - cached
    flop_s = 2 * consts["matmul_params_per_token"] * computed / (matmul_tflops * 1e12)
    return {"bandwidth_floor_s": bw_s, "compute_floor_s": flop_s, "floor_s": max(bw_s, flop_s)}
