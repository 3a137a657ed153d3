"""LLaVA-NeXT (any-resolution images) end to end on the CPU stack, with a tiny seeded
LlavaNextForConditionalGeneration (tests/integration/tiny_llava.py, `next_=True`).

- greedy output through the gRPC API equals HF transformers' `generate` on the same folder
  (its own LlavaNextImageProcessor's pixels and sizes, its processor's placeholder count) for
  two square images of different sizes (2 x 2 tiles, 24 positions each), and for two images of
  different aspect ratios, whose placeholder counts differ (14 and 16);
- the same image after the same text is a cache hit covering its positions; another is not.

The scheduler checks each image's count against its size with the layout the model service
reports (`WorkerInfo.image_layout`), as the model service does.
"""

from __future__ import annotations

import io
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from radixmesh.api import Client

from radixmesh_wire.image_geometry import AnyresGeometry
from tests.conftest import Stack, start_stack
from tests.integration.tiny_llava import PINPOINTS, SIDE, build_tiny_llava, png

pytestmark = pytest.mark.integration

NEW = 6
GEOM = AnyresGeometry(SIDE, 4, pinpoints=tuple((h, w) for h, w in PINPOINTS), side=2)


@pytest.fixture(scope="module")
def next_dir(tmp_path_factory: pytest.TempPathFactory, model_dir: Path) -> Path:
    return build_tiny_llava(tmp_path_factory.mktemp("tiny-next") / "m", model_dir, next_=True)


@pytest.fixture(scope="module")
def next_stack(tmp_path_factory: pytest.TempPathFactory, next_dir: Path) -> Iterator[Stack]:
    yield from start_stack(
        tmp_path_factory.mktemp("next_stack"),
        model_args=["--model", str(next_dir), "--kv-tokens", "2048"],
        scheduler_args=["--radix", "tree", "--debug-invariants"],
        tokenizer_args=["--model", str(next_dir)],
    )


def _hf_greedy(folder: Path, text: str, images: list[bytes]) -> list[int]:
    from PIL import Image
    from transformers import (
        AutoTokenizer,
        LlavaNextForConditionalGeneration,
        LlavaNextImageProcessor,
    )

    tok = AutoTokenizer.from_pretrained(folder)
    hf = LlavaNextForConditionalGeneration.from_pretrained(folder).eval()
    image_id = hf.config.image_token_index
    pics: list[Image.Image] = [Image.open(io.BytesIO(b)) for b in images]
    out = LlavaNextImageProcessor.from_pretrained(folder)(pics, return_tensors="pt")
    sizes = [tuple(int(x) for x in s) for s in out["image_sizes"]]
    it = iter(sizes)
    ids: list[int] = []
    for t in tok.encode(text):
        ids += [t] * (GEOM.tokens(next(it)) if t == image_id else 1)  # type: ignore[arg-type]
    with torch.no_grad():
        gen = hf.generate(
            torch.tensor([ids]),
            pixel_values=out["pixel_values"],
            image_sizes=out["image_sizes"],
            max_new_tokens=NEW,
            min_new_tokens=NEW,
            do_sample=False,
        )
    return [int(t) for t in gen[0, len(ids) :]]


def test_square_images_greedy_matches_hf(next_stack: Stack, next_dir: Path) -> None:
    images = [png(3, w=60, h=60), png(4, w=90, h=90)]  # 2 x 2 tiles each, nothing to unpad
    assert GEOM.tokens((60, 60)) == GEOM.tokens((90, 90)) == GEOM.max_tokens() == 24
    text = "First <image> then <image>: what changed?"
    with Client(next_stack.endpoint) as c:
        got = c.generate(
            text, images=images, max_new_tokens=NEW, min_new_tokens=NEW, temperature=0.0
        )
    assert got.output_ids == _hf_greedy(next_dir, text, images)


def test_two_aspect_ratios_greedy_matches_hf(next_stack: Stack, next_dir: Path) -> None:
    images = [png(1, w=60, h=20), png(2, w=20, h=60)]  # 1 x 2 and 2 x 1 tiles: 14, 16
    assert GEOM.tokens((20, 60)) != GEOM.tokens((60, 20))
    text = "First <image> then <image>: what changed?"
    with Client(next_stack.endpoint) as c:
        got = c.generate(
            text, images=images, max_new_tokens=NEW, min_new_tokens=NEW, temperature=0.0
        )
        marked = len(c.tokenize(text, add_special_tokens=True))  # one id per marker
    assert got.prompt_tokens == marked - 2 + 14 + 16
    assert got.output_ids == _hf_greedy(next_dir, text, images)


def test_same_image_hits_the_cache_another_does_not(next_stack: Stack) -> None:
    text = "Here is a photo: <image> Describe it in one word."
    a, b = png(11, w=70, h=70), png(12, w=70, h=70)
    n = GEOM.tokens((70, 70))
    with Client(next_stack.endpoint) as c:
        first, again, other = (
            c.generate(text, images=[im], max_new_tokens=2, temperature=0.0) for im in (a, a, b)
        )
        head = len(c.tokenize("Here is a photo: ", add_special_tokens=True))
    assert first.cached_tokens <= head
    assert again.cached_tokens >= head + n  # the image's KV is reused
    assert other.cached_tokens == head
