"""The front door's any-resolution preprocessing (tokenizer_service/image_anyres.py) against
transformers' own LlavaNextImageProcessorPil: the same tiles (base first), the same pixel
values, the same image size; the placeholder count is HF processor's for that size; the key
covers the size; pinpoints that give too many tiles are refused."""

from __future__ import annotations

import io

import numpy as np
import pytest

from radixmesh_wire.image_geometry import AnyresGeometry, select_best_resolution
from tokenizer_service.image_anyres import check_tiles
from tokenizer_service.images import (
    MAX_REQUEST_PIXEL_BYTES,
    ImageBounds,
    ImageSpec,
    PreparedImage,
    place,
    prepare,
)
from tokenizer_service.validation import InvalidRequest

PINS = ((28, 56), (56, 28), (56, 56), (84, 28), (28, 84))
GEOM = AnyresGeometry(28, 4, pinpoints=PINS, side=2)
SPEC = ImageSpec(
    image_token_id=299,
    image_token="<image>",
    tokens_per_image=GEOM.max_tokens(),
    shortest_edge=28,
    crop=(28, 28),
    mean=(0.48145466, 0.4578275, 0.40821073),
    std=(0.26862954, 0.26130258, 0.27577711),
    anyres=GEOM,
    base=(28, 28),
)


def png(w: int, h: int, seed: int = 0) -> bytes:
    from PIL import Image

    arr = np.random.default_rng(seed).integers(0, 256, (h, w, 3), dtype=np.uint8)
    buf = io.BytesIO()
    Image.fromarray(arr).save(buf, format="PNG")
    return buf.getvalue()


def _hf_processor():  # type: ignore[no-untyped-def]
    from transformers.models.llava_next.image_processing_pil_llava_next import (
        LlavaNextImageProcessorPil,
    )

    return LlavaNextImageProcessorPil(
        size={"shortest_edge": 28},
        crop_size={"height": 28, "width": 28},
        image_grid_pinpoints=[list(p) for p in PINS],
    )


@pytest.mark.parametrize(("w", "h"), [(40, 30), (30, 61), (90, 25), (28, 28), (57, 57)])
def test_tiles_match_llava_next_image_processor(w: int, h: int) -> None:
    from PIL import Image

    data = png(w, h, seed=w + h)
    out = _hf_processor()(Image.open(io.BytesIO(data)), return_tensors="np")
    want, want_size = out["pixel_values"][0], tuple(int(x) for x in out["image_sizes"][0])
    got = prepare(data, SPEC, ImageBounds())
    assert got.size == want_size == (h, w)
    assert got.pixels.shape == want.shape == (GEOM.tiles((h, w)), 3, 28, 28)
    np.testing.assert_allclose(got.values(SPEC), want, atol=1e-5)


@pytest.mark.parametrize(("h", "w"), [(30, 40), (61, 30), (25, 90), (28, 28), (100, 37)])
def test_token_count_is_hf_processors(h: int, w: int) -> None:
    """LlavaNextProcessor._get_number_of_features, with its CLS accounting: the tower's
    (28 / 14)^2 patches + 1 CLS, less 1 under 'default'."""
    from transformers import LlavaNextProcessor

    proc = LlavaNextProcessor.__new__(LlavaNextProcessor)  # only its size arithmetic is used
    proc.image_processor = _hf_processor()
    proc.patch_size = 14
    proc.num_additional_image_tokens = 1
    want = proc._get_number_of_features(h, w, 28, 28) - 1  # "default" drops the CLS
    assert GEOM.tokens((h, w)) == want
    assert GEOM.tokens((h, w)) <= GEOM.max_tokens()


def test_placeholders_follow_the_size_and_the_key_covers_it() -> None:
    wide, tall = (
        prepare(png(60, 20, 1), SPEC, ImageBounds()),
        prepare(png(20, 60, 1), SPEC, ImageBounds()),
    )
    ids, inputs = place([1, 299, 5, 299], [wide, tall], SPEC, 300)
    a, b = inputs
    assert (a.n_tokens, b.n_tokens) == (GEOM.tokens((20, 60)), GEOM.tokens((60, 20)))
    assert a.image_size == (20, 60) and a.shape == (3 * GEOM.tiles((20, 60)), 28, 28)
    assert ids == [1] + [a.pseudo_id] * a.n_tokens + [5] + [b.pseudo_id] * b.n_tokens
    again = prepare(png(60, 20, 1), SPEC, ImageBounds())
    assert place([299], [again], SPEC, 300)[1][0].pseudo_id == a.pseudo_id
    assert a.pseudo_id != b.pseudo_id


def test_best_resolution_is_hfs() -> None:
    from transformers.image_processing_utils import select_best_resolution as hf_best

    pins = [list(p) for p in PINS]
    for size in [(30, 40), (61, 30), (25, 90), (28, 28), (1000, 10), (10, 1000), (56, 56)]:
        assert select_best_resolution(size, PINS) == tuple(hf_best(size, pins))


def test_too_many_tiles_refused() -> None:
    with pytest.raises(ValueError, match="tiles per image"):
        check_tiles(AnyresGeometry(28, 4, pinpoints=((28 * 8, 28 * 8),), side=2))
    with pytest.raises(ValueError, match="not a multiple"):
        AnyresGeometry(28, 4, pinpoints=((30, 56),), side=2)
    with pytest.raises(ValueError, match="one feature per patch"):
        AnyresGeometry(28, 5, pinpoints=PINS, side=2)


def test_a_request_whose_pixels_cannot_fit_one_message_is_refused() -> None:
    """LLaVA-NeXT's tiles multiply an image's pixels: a request's total is bounded so that it
    always fits the internal messages that carry it."""
    tile = np.zeros((5, 3, 336, 336), np.uint8)  # one LLaVA-NeXT-7B image: 1.7 MB
    image = PreparedImage(tile, b"k" * 32, (480, 640))
    n = MAX_REQUEST_PIXEL_BYTES // tile.nbytes
    place([299] * n, [image] * n, SPEC, 300)
    with pytest.raises(InvalidRequest, match="bytes of pixels"):
        place([299] * (n + 1), [image] * (n + 1), SPEC, 300)
