"""Batched sampling whose randomness is a pure function of (request seed, output position).

Every random draw comes from a counter-based integer hash of (seed, position, token id), so a
seeded request yields the same tokens however it is batched, chunked, retracted or resubmitted,
on CPU and GPU alike (the hash is exact integer arithmetic). Sampling uses the exponential race:
argmax(p_i / E_i) with E_i ~ Exp(1) draws index i with probability p_i.

Logprobs are reported from the unmodified distribution (log_softmax of the raw logits), as
SGLang and OpenAI report them; penalties, logit bias, temperature and filters only shape what
is drawn (greedy rows take the argmax of the penalized logits).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

_M32 = 0xFFFFFFFF


def _mix32(x: torch.Tensor) -> torch.Tensor:
    """lowbias32 integer hash on int64 tensors holding uint32 values (wrapping products keep
    the low 32 bits exact)."""
    x = x & _M32
    x = x ^ (x >> 16)
    x = (x * 0x7FEB352D) & _M32
    x = x ^ (x >> 15)
    x = (x * 0x846CA68B) & _M32
    return x ^ (x >> 16)


# Bits of the hash that become a uniform draw. float32 carries 24 significant bits, so
# (k + 0.5) / 2**23 is exact for every 23-bit k and lies strictly inside (0, 1). With 24 bits
# the top value (2**24 - 0.5) / 2**24 rounded up to exactly 1.0: -log(1) = 0, the exponential
# race divided by zero, and argmax took that token whatever top-k, top-p, min-p or the grammar
# mask said (about one sampled position in 270).
NOISE_BITS = 23


def unit_from_bits(k: torch.Tensor) -> torch.Tensor:
    """Integers in [0, 2**NOISE_BITS) -> float32 midpoints (k + 0.5) / 2**NOISE_BITS, every one
    exact and strictly inside (0, 1)."""
    return (k.to(torch.float32) + 0.5) * (1.0 / (1 << NOISE_BITS))


def uniform_noise(seeds: torch.Tensor, positions: torch.Tensor, vocab: int) -> torch.Tensor:
    """[R, vocab] float32 strictly inside (0, 1): U(seed_r, position_r, token)."""
    dev = seeds.device
    s = seeds.to(torch.int64)
    key = _mix32(_mix32(s & _M32) ^ ((s >> 32) & _M32))
    key = _mix32(key ^ _mix32(positions.to(torch.int64) + 0x9E3779B9))
    ids = torch.arange(vocab, device=dev, dtype=torch.int64)
    h = _mix32(key[:, None] ^ _mix32(ids[None, :] * 0x85EBCA6B + 0x27D4EB2F))
    return unit_from_bits(h >> (32 - NOISE_BITS))


@dataclass
class Penalties:
    """Per-row penalties over the tokens each row generated so far, on the logits' device.

    `counts` [R, V] holds how often each token was generated (rows without penalties are
    zero); `bias` [R, V] is added to the logits (OpenAI's logit_bias), None when no row has one.
    """

    counts: torch.Tensor  # int32
    presence: torch.Tensor  # [R] float32
    frequency: torch.Tensor  # [R] float32
    repetition: torch.Tensor  # [R] float32, 1 = off
    bias: torch.Tensor | None = None


def apply_penalties(logits: torch.Tensor, pen: Penalties) -> torch.Tensor:
    """OpenAI's presence/frequency penalties and logit bias, and the CTRL-style repetition
    penalty (SGLang's and vLLM's): returns new logits, the input is left untouched."""
    counts = pen.counts.to(logits.dtype)
    seen = pen.counts > 0
    rep = pen.repetition[:, None]
    scaled = torch.where(logits > 0, logits / rep, logits * rep)
    out = torch.where(seen, scaled, logits)
    out = out - pen.frequency[:, None] * counts - pen.presence[:, None] * seen.to(logits.dtype)
    if pen.bias is not None:
        out = out + pen.bias
    return out


@dataclass
class SamplingBatch:
    """Per-row parameters, tensors of shape [R] on the logits' device."""

    temperature: torch.Tensor
    top_p: torch.Tensor
    top_k: torch.Tensor  # <= 0 means off
    min_p: torch.Tensor
    seeds: torch.Tensor  # int64
    positions: torch.Tensor  # int64: output position of the token being drawn
    # Which stages any row needs, known on the host: deciding from the tensors would read them
    # back and stall the host until the GPU is done, which defeats launching the next step
    # early. None: derive from the tensors (tests, small callers).
    flags: SamplingFlags | None = None
    penalties: Penalties | None = None

    def resolved_flags(self) -> SamplingFlags:
        if self.flags is not None:
            return self.flags
        return SamplingFlags(
            all_greedy=bool((self.temperature <= 0).all()),
            top_k=bool((self.top_k > 0).any()),
            top_p=bool((self.top_p < 1).any()),
            min_p=bool((self.min_p > 0).any()),
        )


@dataclass(frozen=True)
class SamplingFlags:
    all_greedy: bool
    top_k: bool
    top_p: bool
    min_p: bool

    @staticmethod
    def of(
        temperature: list[float], top_k: list[int], top_p: list[float], min_p: list[float]
    ) -> SamplingFlags:
        return SamplingFlags(
            all_greedy=all(t <= 0 for t in temperature),
            top_k=any(k > 0 for k in top_k),
            top_p=any(p < 1 for p in top_p),
            min_p=any(m > 0 for m in min_p),
        )


def sample(
    logits: torch.Tensor, params: SamplingBatch, top_logprobs: int = 0
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
    """logits [R, V] fp32 -> (tokens [R], logprob of each token [R], top ids, top logprobs)."""
    logprobs = torch.log_softmax(logits, dim=-1)
    if params.penalties is not None:
        logits = apply_penalties(logits, params.penalties)
    greedy_tok = logits.argmax(dim=-1)
    flags = params.resolved_flags()
    if flags.all_greedy:
        tokens = greedy_tok
    else:
        temp = params.temperature.clamp(min=1e-5)[:, None]
        probs = torch.softmax(logits / temp, dim=-1)
        probs = _filter(probs, params, flags)
        noise = uniform_noise(params.seeds, params.positions, logits.shape[-1])
        # A filtered or masked token (probability 0) can never win the race, even if a ratio
        # were to come out 0 or NaN: it races at -1, below every live token's positive score.
        race = torch.where(probs > 0, probs / (-torch.log(noise)), -1.0)
        drawn = race.argmax(dim=-1)
        tokens = torch.where(params.temperature <= 0, greedy_tok, drawn)
    chosen = logprobs.gather(1, tokens[:, None]).squeeze(1)
    top_ids = top_vals = None
    if top_logprobs > 0:
        top_vals, top_ids = logprobs.topk(min(top_logprobs, logprobs.shape[-1]), dim=-1)
    return tokens, chosen, top_ids, top_vals


def _filter(probs: torch.Tensor, p: SamplingBatch, flags: SamplingFlags) -> torch.Tensor:
    use_k, use_p, use_min = flags.top_k, flags.top_p, flags.min_p
    if not (use_k or use_p or use_min):
        return probs
    sorted_p, order = probs.sort(dim=-1, descending=True)
    keep = torch.ones_like(sorted_p, dtype=torch.bool)
    ranks = torch.arange(probs.shape[-1], device=probs.device)[None, :]
    if use_k:
        k = torch.where(p.top_k > 0, p.top_k, probs.shape[-1])[:, None]
        keep &= ranks < k
    if use_p:
        before = sorted_p.cumsum(dim=-1) - sorted_p  # mass strictly above this token
        keep &= before < p.top_p[:, None]
    if use_min:
        keep &= sorted_p >= p.min_p[:, None] * sorted_p[:, :1]
    keep[:, 0] = True  # the most likely token always survives
    filtered = torch.zeros_like(probs).scatter_(1, order, sorted_p * keep)
    return filtered / filtered.sum(dim=-1, keepdim=True)
