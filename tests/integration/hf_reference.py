"""HF transformers reference outputs and the numerics rule (docs/architecture.md, "Checking
numerics")."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch


@dataclass
class Reference:
    tokens: list[int]
    margins: list[float]  # top-2 logit margin at each generated position
    logits: list[torch.Tensor]  # fp32 logits at each generated position


class HFReference:
    """Greedy generation with HF in fp32, recording logits for the agreement rule."""

    def __init__(self, model_dir: Path) -> None:
        from transformers import AutoModelForCausalLM

        self.model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()

    @torch.inference_mode()
    def greedy(self, ids: Sequence[int], n: int) -> Reference:
        out = self.model.generate(
            torch.tensor([list(ids)]),
            max_new_tokens=n,
            do_sample=False,
            output_logits=True,
            return_dict_in_generate=True,
            eos_token_id=None,
            pad_token_id=0,
        )
        toks = out.sequences[0, len(ids) :].tolist()
        logits = [lg[0].float() for lg in out.logits]
        margins = [float(t.topk(2).values[0] - t.topk(2).values[1]) for t in logits]
        return Reference(toks, margins, logits)

    @torch.inference_mode()
    def prompt_logprobs(self, ids: Sequence[int]) -> list[float]:
        logits = self.model(torch.tensor([list(ids)])).logits[0].float()
        lp = torch.log_softmax(logits, dim=-1)
        return [float(lp[i - 1, ids[i]]) for i in range(1, len(ids))]


def agree(
    ours: Sequence[int],
    ref: Reference,
    ours_logprobs: Sequence[float] | None = None,
    eos: Sequence[int] = (),
) -> tuple[bool, str]:
    """The numerics rule (docs/architecture.md): sequences agree up to their first difference; a
    difference is accepted only where the reference's top-2 margin is below 10x the largest logit
    difference seen at earlier positions (floor 1e-3 in fp32). With `ours_logprobs` the earlier
    difference is measured on the chosen tokens' log-probabilities (a shift-free view of the
    logits). Both sides ignore EOS: comparison stops at it."""
    limit = min(len(ours), len(ref.tokens))
    worst = 0.0
    for i in range(limit):
        if ref.tokens[i] in eos:
            return True, f"EOS at {i}"
        if ours[i] != ref.tokens[i]:
            tol = 10 * max(worst, 1e-3)
            if ref.margins[i] < tol:
                return True, f"accepted tie at {i} (margin {ref.margins[i]:.2e})"
            return False, (
                f"differ at {i}: ours {ours[i]} vs ref {ref.tokens[i]}, margin {ref.margins[i]:.3f}"
            )
        if ours_logprobs is not None:
            ref_lp = float(torch.log_softmax(ref.logits[i], -1)[ref.tokens[i]])
            worst = max(worst, abs(ours_logprobs[i] - ref_lp))
    if len(ours) < len(ref.tokens):
        return False, "ours is shorter"
    return True, "identical"
