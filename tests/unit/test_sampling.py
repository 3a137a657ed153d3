"""Sampling randomness is a pure function of (seed, position): batching never changes it."""

from __future__ import annotations

import torch

from model_service.sampling import SamplingBatch, sample, uniform_noise


def _params(
    n: int,
    temp: float = 1.0,
    seed: int = 7,
    top_p: float = 1.0,
    top_k: int = -1,
    min_p: float = 0.0,
    start: int = 0,
) -> SamplingBatch:
    return SamplingBatch(
        temperature=torch.full((n,), temp),
        top_p=torch.full((n,), top_p),
        top_k=torch.full((n,), top_k),
        min_p=torch.full((n,), min_p),
        seeds=torch.full((n,), seed, dtype=torch.int64),
        positions=torch.arange(start, start + n, dtype=torch.int64),
    )


def test_noise_depends_only_on_seed_and_position() -> None:
    a = uniform_noise(torch.tensor([1, 2, 1]), torch.tensor([5, 5, 5]), 1000)
    assert torch.equal(a[0], a[2])
    assert not torch.equal(a[0], a[1])
    assert float(a.min()) > 0 and float(a.max()) < 1
    # roughly uniform
    assert abs(float(a.mean()) - 0.5) < 0.02


def test_seeded_draw_same_alone_and_in_batch() -> None:
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(4, 500, generator=g)
    alone = [sample(logits[i : i + 1], _params(1, seed=11, start=i))[0].item() for i in range(4)]
    p = _params(4, seed=11)
    batched = sample(logits, p)[0].tolist()
    assert alone == batched


def test_sampling_follows_distribution() -> None:
    logits = torch.log(torch.tensor([[0.7, 0.2, 0.1]])).repeat(4000, 1)
    p = _params(4000, seed=3)
    toks = sample(logits, p)[0]
    freq = torch.bincount(toks, minlength=3).float() / 4000
    assert torch.allclose(freq, torch.tensor([0.7, 0.2, 0.1]), atol=0.03)


def test_filters_and_greedy() -> None:
    logits = torch.log(torch.tensor([[0.5, 0.3, 0.15, 0.05]])).repeat(500, 1)
    assert set(sample(logits, _params(500, top_k=2))[0].tolist()) <= {0, 1}
    assert set(sample(logits, _params(500, top_p=0.6))[0].tolist()) <= {0, 1}
    assert set(sample(logits, _params(500, min_p=0.5))[0].tolist()) <= {0, 1}
    assert set(sample(logits, _params(500, temp=0.0))[0].tolist()) == {0}
    toks, lps, top_ids, top_vals = sample(logits[:1], _params(1, temp=0.0), top_logprobs=2)
    assert top_ids is not None and top_ids[0].tolist() == [0, 1]
    assert abs(float(lps[0]) - float(torch.log(torch.tensor(0.5)))) < 1e-5
