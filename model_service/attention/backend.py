"""The attention-backend interface: what the runner, the model and the CUDA-graph code rely on.

A backend attends over the slot-indexed KV pool. Per step the runner calls `plan` once with one
`RowPlan` per row (request) and the step's output slots; then the model calls, per layer,
either `forward` (store this step's k/v at the output slots, then attend) or, in the fused
layers, `kv_target` (where to store k/v themselves) followed by `attend`. Each row's queries are
its last `q_len` tokens: they see the row's whole slot list (prefix + new) causally.

Backends: `reference.ReferenceAttention` (plain torch, any device) and
`flashinfer.FlashInferAttention` (CUDA). `LayerAttention` is the per-layer half alone, which is
all a captured CUDA graph's forward pass sees.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import torch


@dataclass
class RowPlan:
    q_len: int
    kv_slots: torch.Tensor  # int64 [kv_len] on the pool's device, in sequence order


class LayerAttention(Protocol):
    """The per-layer calls the model makes (after the step was planned)."""

    def forward(
        self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor
    ) -> torch.Tensor:
        """Store k/v [T, kv_heads, D] at the step's output slots, then `attend`."""
        ...

    def kv_target(self, layer: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(k cache, v cache, output slots) of `layer`, for callers that store k/v themselves."""
        ...

    def attend(self, layer: int, q: torch.Tensor) -> torch.Tensor:
        """Attention of q [T, heads, D] over the pool; this step's k/v are already stored."""
        ...


class AttentionBackend(LayerAttention, Protocol):
    @property
    def name(self) -> str:
        """`reference` or `flashinfer` (WorkerInfo.attention_backend)."""
        ...

    def plan(
        self, rows: Sequence[RowPlan], out_slots: torch.Tensor, kv_flat: torch.Tensor | None = None
    ) -> None:
        """Prepare one step. `out_slots`: int64 [T], where this step's T tokens' k/v go.
        `kv_flat`: every row's `kv_slots` already concatenated on the device (optional)."""
        ...
