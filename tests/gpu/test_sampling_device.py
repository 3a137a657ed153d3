"""The sampler on the device: the same seeded draws as the CPU reference, and never a token
outside top-k, top-p, min-p or the grammar mask (the reliability issue's sampler defect). Runs
on CPU everywhere and on CUDA where there is one; CPU CI runs this file."""

from __future__ import annotations

import pytest
import torch

from model_service.sampling import SamplingBatch, sample, uniform_noise

DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


def _batch(rows: int, dev: str, seed: int, g: torch.Generator) -> SamplingBatch:
    return SamplingBatch(
        temperature=torch.full((rows,), 1.2, device=dev),
        top_p=torch.full((rows,), 0.95, device=dev),
        top_k=torch.randint(1, 40, (rows,), generator=g).to(dev),
        min_p=torch.full((rows,), 0.02, device=dev),
        seeds=torch.full((rows,), seed, dtype=torch.int64, device=dev),
        positions=torch.arange(rows, dtype=torch.int64, device=dev) * 3,
    )


@pytest.mark.parametrize("dev", DEVICES)
def test_noise_same_on_every_device_and_inside_the_unit_interval(dev: str) -> None:
    seeds = torch.arange(64, dtype=torch.int64)
    pos = torch.arange(64, dtype=torch.int64) * 11
    cpu = uniform_noise(seeds, pos, 32000)
    here = uniform_noise(seeds.to(dev), pos.to(dev), 32000).cpu()
    assert torch.equal(cpu, here)
    assert float(here.min()) > 0 and float(here.max()) < 1


@pytest.mark.parametrize("dev", DEVICES)
def test_sweep_every_token_inside_filters_and_mask(dev: str) -> None:
    g = torch.Generator().manual_seed(3)
    vocab, rows = 128256 if dev == "cuda" else 32000, 128
    for rnd in range(4 if dev == "cpu" else 16):
        logits = (torch.randn(rows, vocab, generator=g) * 2).to(dev)
        allowed = (torch.rand(rows, vocab, generator=g) < 0.2).to(dev)
        allowed[:, 0] = True
        masked = logits.masked_fill(~allowed, float("-inf"))
        p = _batch(rows, dev, 500 + rnd, g)
        toks = sample(masked, p)[0]
        assert bool(allowed.gather(1, toks[:, None]).all())
        probs = torch.softmax(masked / 1.2, dim=-1)
        sorted_p, order = probs.sort(dim=-1, descending=True)
        rank = (order == toks[:, None]).int().argmax(dim=-1)
        assert bool((rank < p.top_k).all())
        mass_above = (sorted_p.cumsum(-1) - sorted_p).gather(1, rank[:, None]).squeeze(1)
        assert bool(((rank == 0) | (mass_above < 0.95)).all())
        chosen = probs.gather(1, toks[:, None]).squeeze(1)
        assert bool((chosen >= 0.02 * sorted_p[:, 0]).all())
