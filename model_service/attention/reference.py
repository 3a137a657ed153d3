"""Reference attention over the slot-indexed KV pool: plain torch, any device.

Each row (request) of a step has `q_len` new tokens at the end of its `kv_slots` (prefix and new
slots, in sequence order). Decode rows (q_len == 1) are attended together as one padded batch;
prefill rows one by one with a causal mask offset by their prefix. Padding gathers a real slot
of the same row (never an arbitrary one), so a NaN-poisoned free slot can never leak in through
masked positions (0 * NaN is NaN).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Final

import torch
from torch.nn import functional as F

from model_service.attention.backend import RowPlan
from model_service.kv_pool import KVPool

__all__ = ["ReferenceAttention", "RowPlan"]


class ReferenceAttention:
    """An `AttentionBackend`."""

    name: Final = "reference"

    def __init__(self, pool: KVPool, num_heads: int, head_dim: int) -> None:
        self.pool = pool
        self.nh = num_heads
        self.scale = head_dim**-0.5
        self.rows: list[RowPlan] = []
        self.out_slots = torch.empty(0, dtype=torch.int64)

    def plan(
        self, rows: Sequence[RowPlan], out_slots: torch.Tensor, kv_flat: torch.Tensor | None = None
    ) -> None:
        self.rows = list(rows)
        self.out_slots = out_slots
        dev = self.pool.k.device
        self.decode_idx = [i for i, r in enumerate(self.rows) if r.q_len == 1]
        starts, pos = [], 0
        for r in self.rows:
            starts.append(pos)
            pos += r.q_len
        self.starts = starts
        if len(self.decode_idx) > 1:
            lens = [self.rows[i].kv_slots.numel() for i in self.decode_idx]
            width = max(lens)
            padded = torch.stack(
                [
                    F.pad(
                        self.rows[i].kv_slots, (0, width - n), value=int(self.rows[i].kv_slots[0])
                    )
                    for i, n in zip(self.decode_idx, lens, strict=True)
                ]
            )
            self.dec_slots = padded.to(dev)
            ar = torch.arange(width, device=dev)
            self.dec_mask = ar[None, :] < torch.tensor(lens, device=dev)[:, None]  # [B, W]
            self.dec_q_rows = torch.tensor([starts[i] for i in self.decode_idx], device=dev)

    def forward(
        self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor
    ) -> torch.Tensor:
        self.pool.write(layer, self.out_slots, k, v)
        return self.attend(layer, q)

    def kv_target(self, layer: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        return self.pool.k[layer], self.pool.v[layer], self.out_slots

    def attend(self, layer: int, q: torch.Tensor) -> torch.Tensor:
        """Attention of this step's queries over the pool (this step's k/v already stored)."""
        kc, vc = self.pool.k[layer], self.pool.v[layer]
        out = torch.empty_like(q)
        batched = len(self.decode_idx) > 1
        if batched:
            qd = q.index_select(0, self.dec_q_rows).unsqueeze(2)  # [B, H, 1, D]
            kd = kc[self.dec_slots].transpose(1, 2)  # [B, KVH, W, D]
            vd = vc[self.dec_slots].transpose(1, 2)
            mask = self.dec_mask[:, None, None, :]
            od = F.scaled_dot_product_attention(
                qd, kd, vd, attn_mask=mask, scale=self.scale, enable_gqa=True
            )
            out.index_copy_(0, self.dec_q_rows, od.squeeze(2))
        for i, r in enumerate(self.rows):
            if batched and r.q_len == 1:
                continue
            s = self.starts[i]
            qi = q[s : s + r.q_len].transpose(0, 1)  # [H, n, D]
            ki = kc[r.kv_slots].transpose(0, 1)  # [KVH, S, D]
            vi = vc[r.kv_slots].transpose(0, 1)
            kv_len = r.kv_slots.numel()
            prefix = kv_len - r.q_len
            # query j (absolute prefix + j) sees keys 0..prefix + j
            mask = (
                torch.arange(kv_len, device=q.device)[None, :]
                <= prefix + torch.arange(r.q_len, device=q.device)[:, None]
            )
            oi = F.scaled_dot_product_attention(
                qi, ki, vi, attn_mask=mask, scale=self.scale, enable_gqa=True
            )
            out[s : s + r.q_len] = oi.transpose(0, 1)
        return out
