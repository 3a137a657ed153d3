"""Tensor-parallel sharding of a Llama-family model: which part of each weight a rank holds.

Megatron-style: column-parallel q/k/v and gate/up (each rank computes its heads and its slice
of the MLP), row-parallel o and down (each rank's partial sum, then an all-reduce),
vocab-parallel embedding and LM head (rows of the vocabulary; the embedding's partial rows are
all-reduced, the logits all-gathered). KV heads are split over ranks; with fewer KV heads
than ranks each rank holds the one KV head its query heads use (replicated `tp / kv_heads`
times). Pure functions of the HF-named full tensor and (rank, size): no torch.distributed
here, so they are unit-tested alone and shared by the checkpoint and random-weight loaders.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch

from model_service.models.llama import LlamaArgs
from services.model_store import ModelError


@dataclass(frozen=True)
class Shard:
    """This process's place in its tensor-parallel group."""

    rank: int = 0
    size: int = 1

    def __post_init__(self) -> None:
        if not 0 <= self.rank < self.size:
            raise ValueError(f"rank {self.rank} outside a group of {self.size}")


def check_divisible(a: LlamaArgs, tp: int) -> None:
    """ModelError unless `a` splits over `tp` ranks (heads, KV heads, MLP width)."""
    if tp == 1:
        return
    problems = []
    if a.num_heads % tp:
        problems.append(f"{a.num_heads} attention heads")
    kv = a.num_kv_heads
    if (kv >= tp and kv % tp) or (kv < tp and tp % kv):
        problems.append(f"{kv} KV heads (need a multiple of {tp}, or a divisor of it)")
    if a.intermediate_size % tp:
        problems.append(f"MLP width {a.intermediate_size}")
    if problems:
        raise ModelError(
            f"--tp {tp} cannot split this model: {'; '.join(problems)} do not divide by {tp}. "
            f"Use a --tp that divides {a.num_heads} heads and {a.intermediate_size}"
        )


def vocab_rows(vocab: int, tp: int) -> int:
    """Rows of the vocabulary per rank (the last rank's are padded with zeros)."""
    return -(-vocab // tp)


def kv_heads_local(a: LlamaArgs, tp: int) -> int:
    return max(a.num_kv_heads // tp, 1)


def local_args(a: LlamaArgs, tp: int) -> LlamaArgs:
    """The shapes one rank builds: its heads, KV heads, MLP slice and vocabulary rows (the
    model's code runs unchanged on these; only the reductions are added)."""
    if tp == 1:
        return a
    check_divisible(a, tp)
    return dataclasses.replace(
        a,
        num_heads=a.num_heads // tp,
        num_kv_heads=kv_heads_local(a, tp),
        intermediate_size=a.intermediate_size // tp,
        vocab_size=vocab_rows(a.vocab_size, tp),
    )


def _kv_head_range(a: LlamaArgs, s: Shard) -> tuple[int, int]:
    if a.num_kv_heads >= s.size:
        n = a.num_kv_heads // s.size
        return s.rank * n, (s.rank + 1) * n
    # Fewer KV heads than ranks: rank r's query heads all belong to KV head r // (tp / kv).
    h = s.rank // (s.size // a.num_kv_heads)
    return h, h + 1


def _rows(t: torch.Tensor, start: int, stop: int) -> torch.Tensor:
    return t[start:stop]


def take(name: str, full: torch.Tensor, a: LlamaArgs, s: Shard) -> torch.Tensor:
    """Rank `s.rank`'s part of the HF tensor `name` (full shape as in the checkpoint)."""
    if s.size == 1:
        return full
    hd, tp, r = a.head_dim, s.size, s.rank
    leaf = name.split(".")[-2] if "." in name else name
    if leaf in ("embed_tokens", "lm_head"):
        n = vocab_rows(a.vocab_size, tp)
        part = full[r * n : (r + 1) * n]
        if part.shape[0] < n:  # the last rank's rows past the vocabulary: zeros, never used
            pad = full.new_zeros((n - part.shape[0], *full.shape[1:]))
            part = torch.cat([part, pad])
        return part
    if leaf == "q_proj":
        n = a.num_heads // tp * hd
        return _rows(full, r * n, (r + 1) * n)
    if leaf in ("k_proj", "v_proj"):
        h0, h1 = _kv_head_range(a, s)
        return _rows(full, h0 * hd, h1 * hd)
    if leaf == "o_proj":
        n = a.num_heads // tp * hd
        return full[:, r * n : (r + 1) * n]
    if leaf in ("gate_proj", "up_proj"):
        n = a.intermediate_size // tp
        return _rows(full, r * n, (r + 1) * n)
    if leaf == "down_proj":
        n = a.intermediate_size // tp
        return full[:, r * n : (r + 1) * n]
    return full  # norms: every rank holds them whole


def local_param_count(a: LlamaArgs, tp: int) -> int:
    """Parameters one rank holds (norms and replicated KV heads counted on every rank)."""
    from model_service.preflight import param_count

    return param_count(local_args(a, tp))


ONE = Shard()  # no tensor parallelism: the whole model on one rank
