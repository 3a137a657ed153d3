"""Per-request token counts for sampling penalties, kept on the logits' device.

A penalized request owns a [V] int32 count vector, created at its first sampled row (seeded
with the output it had before this admission) and bumped with each token it draws, on the
device: the sampled token never has to reach the host first, so launching the next step early
stays possible. Requests without penalties cost nothing.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from model_service.sampling import Penalties
from model_service.transfer import to_device
from radixmesh_wire.step_ops import Sampling


class TokenCounts:
    """The count vector of one request (None until its first sampled row)."""

    def __init__(self) -> None:
        self.counts: torch.Tensor | None = None

    def ensure(self, s: Sampling, vocab: int, dev: torch.device) -> torch.Tensor:
        if self.counts is None:
            self.counts = torch.zeros(vocab, dtype=torch.int32, device=dev)
            if s.penalty_history:
                hist = to_device(list(s.penalty_history), torch.int64, dev)
                self.counts.index_add_(0, hist, torch.ones_like(hist, dtype=torch.int32))
        return self.counts


def build_penalties(
    rows: Sequence[tuple[Sampling, TokenCounts]], vocab: int, dev: torch.device
) -> Penalties | None:
    """The batch's Penalties, or None when no row has a penalty or a logit bias."""
    pen = [s.penalized for s, _ in rows]
    biased = [bool(s.logit_bias) for s, _ in rows]
    if not any(pen) and not any(biased):
        return None
    counts = torch.zeros(len(rows), vocab, dtype=torch.int32, device=dev)
    for i, (s, tc) in enumerate(rows):
        if pen[i]:
            counts[i] = tc.ensure(s, vocab, dev)
    bias = None
    if any(biased):
        r_idx = [i for i, (s, _) in enumerate(rows) for _ in s.logit_bias]
        t_idx = [t for s, _ in rows for t, _ in s.logit_bias]
        vals = [b for s, _ in rows for _, b in s.logit_bias]
        bias = torch.zeros(len(rows), vocab, dtype=torch.float32, device=dev)
        bias.index_put_(
            (to_device(r_idx, torch.int64, dev), to_device(t_idx, torch.int64, dev)),
            to_device(vals, torch.float32, dev),
        )
    return Penalties(
        counts=counts,
        presence=to_device([s.presence_penalty for s, _ in rows], torch.float32, dev),
        frequency=to_device([s.frequency_penalty for s, _ in rows], torch.float32, dev),
        repetition=to_device([s.repetition_penalty for s, _ in rows], torch.float32, dev),
        bias=bias,
    )


def count_sampled(rows: Sequence[tuple[Sampling, TokenCounts]], tokens: torch.Tensor) -> None:
    """Add each penalized row's drawn token (device tensor [R]) to its counts."""
    for i, (s, tc) in enumerate(rows):
        if s.penalized and tc.counts is not None:
            tok = tokens[i : i + 1]
            tc.counts.index_add_(0, tok, torch.ones(1, dtype=torch.int32, device=tok.device))
