"""What a step does with its logits besides sampling: grammar masks and min_new_tokens bans
edit the sampled rows before any draw, and prompt logprobs are read from the prompt rows.

Per step, never per token: each function takes the step's rows at once. Split from the
runner (`runner.py`), which calls them in this order: prompt logprobs after the forward pass,
then masks, then bans.
"""

from __future__ import annotations

import torch

from model_service.mask_device import allowed_on_device
from model_service.runner_state import StepRow
from model_service.transfer import to_device
from radixmesh_wire.mask_rows import EncodedRow
from radixmesh_wire.step_ops import PromptLogprobs


def prompt_logprobs(
    rows: list[StepRow], spans: list[tuple[int, int, int] | None], logits: torch.Tensor
) -> list[PromptLogprobs]:
    """Rare (asked per request): reads values back at once, so no launch-ahead here."""
    out: list[PromptLogprobs] = []
    for r, span in zip(rows, spans, strict=True):
        if span is None or r.input_ids is None:
            continue
        st = r.state
        row0, first, end = span
        lp = torch.log_softmax(logits[row0 : row0 + end - first], dim=-1)
        start = end - len(r.input_ids)
        values: list[float] = []
        abs_start = first + 1
        p = st.sampling.prompt_logprobs_from
        if st.pending_lp is not None and start >= max(p, 1):
            values.append(float(st.pending_lp[r.input_ids[0]]))  # across a chunk boundary
            abs_start = start
        # logits at absolute i (first..end-2) score the token at i + 1 in this chunk
        nxt = torch.tensor(r.input_ids[first + 1 - start :], dtype=torch.int64, device=lp.device)
        if nxt.numel():
            values.extend(lp[: nxt.numel()].gather(1, nxt[:, None]).squeeze(1).tolist())
        st.pending_lp = lp[-1] if not r.sample else None
        if values:
            out.append(PromptLogprobs(r.handle, abs_start, values))
    return out


def apply_masks(sampled: list[StepRow], lg: torch.Tensor, masks: dict[int, EncodedRow]) -> None:
    """Grammar masks: disallowed tokens get -inf before any sampling (never unmasked)."""
    idx = [i for i, r in enumerate(sampled) if r.handle in masks]
    if not idx:
        return
    rows = [masks[sampled[i].handle] for i in idx]
    allowed = allowed_on_device(rows, lg.shape[-1], lg.device)
    sel = to_device(idx, torch.int64, lg.device)
    lg[sel] = lg[sel].masked_fill(~allowed, float("-inf"))


def ban_stops(sampled: list[StepRow], lg: torch.Tensor, masked: bool) -> None:
    """min_new_tokens: stop ids (EOS included) get -inf while fewer were sampled. After the
    grammar masks, and never down to nothing: where a grammar allows only its end (EOS),
    the grammar wins and the request ends early (docs/constrained.md)."""
    dev = lg.device
    rows: list[int] = []
    for i, r in enumerate(sampled):
        if r.state.sampled < r.state.sampling.min_new_tokens and r.state.sampling.stop_ids:
            rows.append(i)
    if not rows:
        return
    before = lg.index_select(0, to_device(rows, torch.int64, dev)) if masked else None
    for i in rows:
        banned = to_device(list(sampled[i].state.sampling.stop_ids), torch.int64, dev)
        lg[i].index_fill_(0, banned, float("-inf"))  # no host scalar copy (a sync)
    if before is not None:  # on the device: no sync to ask whether anything is left
        sel = to_device(rows, torch.int64, dev)
        after = lg.index_select(0, sel)
        left = (after > float("-inf")).any(dim=-1, keepdim=True)
        lg.index_copy_(0, sel, torch.where(left, after, before))
