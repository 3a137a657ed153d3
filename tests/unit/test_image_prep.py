"""The front door's image preparation (tokenizer_service/images.py).

Pixel values must match transformers' CLIPImageProcessor (its PIL backend) for the same
image; bad images (truncated PNG, 20k x 20k pixels, not an image, too many bytes) are
InvalidRequest; markers expand into the image's pseudo-id positions; the same image gives
the same ids and another image other ids.
"""

from __future__ import annotations

import io

import numpy as np
import pytest

from tokenizer_service.images import ImageBounds, ImageSpec, place, prepare
from tokenizer_service.validation import InvalidRequest

SPEC = ImageSpec(
    image_token_id=299,
    image_token="<image>",
    tokens_per_image=4,
    shortest_edge=28,
    crop=(28, 28),
    mean=(0.48145466, 0.4578275, 0.40821073),
    std=(0.26862954, 0.26130258, 0.27577711),
)


def png(w: int, h: int, seed: int = 0, fmt: str = "PNG") -> bytes:
    from PIL import Image

    arr = np.random.default_rng(seed).integers(0, 256, (h, w, 3), dtype=np.uint8)
    buf = io.BytesIO()
    Image.fromarray(arr).save(buf, format=fmt)
    return buf.getvalue()


@pytest.mark.parametrize(("w", "h"), [(40, 30), (30, 50), (28, 28), (100, 37)])
def test_pixels_match_clip_image_processor(w: int, h: int) -> None:
    from PIL import Image
    from transformers.models.clip.image_processing_pil_clip import CLIPImageProcessorPil

    data = png(w, h, seed=w)
    ref = CLIPImageProcessorPil(size={"shortest_edge": 28}, crop_size={"height": 28, "width": 28})
    want = ref(Image.open(io.BytesIO(data)), return_tensors="np")["pixel_values"][0]
    got = prepare(data, SPEC, ImageBounds()).values(SPEC)
    assert got.shape == want.shape == (3, 28, 28)
    np.testing.assert_allclose(got, want, atol=1e-5)


def test_truncated_png_is_refused() -> None:
    data = png(64, 64)
    with pytest.raises(InvalidRequest, match="cannot be decoded"):
        prepare(data[: len(data) // 2], SPEC, ImageBounds())


def test_huge_image_is_refused_from_its_header() -> None:
    from PIL import Image

    buf = io.BytesIO()
    Image.new("1", (20000, 20000)).save(buf, format="PNG")  # a few kB, 400 M pixels
    with pytest.raises(InvalidRequest, match="pixels"):
        prepare(buf.getvalue(), SPEC, ImageBounds())


def test_not_an_image_and_too_many_bytes_are_refused() -> None:
    with pytest.raises(InvalidRequest, match="cannot be decoded"):
        prepare(b"%PDF-1.4 not an image", SPEC, ImageBounds())
    with pytest.raises(InvalidRequest, match="bytes"):
        prepare(png(64, 64), SPEC, ImageBounds(max_bytes=100))


def test_markers_expand_to_hash_keyed_positions() -> None:
    a, a2, b = (prepare(png(32, 32, s), SPEC, ImageBounds()) for s in (1, 1, 2))
    ids, inputs = place([1, 299, 5, 299, 6], [a, b], SPEC, 300)
    pa, pb = inputs[0].pseudo_id, inputs[1].pseudo_id
    assert ids == [1, pa, pa, pa, pa, 5, pb, pb, pb, pb, 6]
    assert [im.offset for im in inputs] == [1, 6]
    assert pa != pb and min(pa, pb) >= 300
    assert place([299], [a2], SPEC, 300)[1][0].pseudo_id == pa  # same content, same key
    with pytest.raises(InvalidRequest, match="1 image markers"):
        place([1, 299], [a, b], SPEC, 300)


@pytest.mark.parametrize(("w", "h"), [(40, 30), (30, 50), (100, 37)])
def test_pixels_match_siglip_image_processor(w: int, h: int) -> None:
    """SigLIP's processor resizes to a fixed size (no crop) and normalises with 0.5."""
    from PIL import Image
    from transformers.models.siglip.image_processing_pil_siglip import SiglipImageProcessorPil

    spec = ImageSpec(299, "<image>", 4, 0, (28, 28), (0.5, 0.5, 0.5), (0.5, 0.5, 0.5))
    data = png(w, h, seed=h)
    ref = SiglipImageProcessorPil(size={"height": 28, "width": 28})
    want = ref(Image.open(io.BytesIO(data)), return_tensors="np")["pixel_values"][0]
    got = prepare(data, spec, ImageBounds()).values(spec)
    assert got.shape == want.shape == (3, 28, 28)
    np.testing.assert_allclose(got, want, atol=1e-5)


def test_pixels_travel_as_bytes_and_the_model_service_normalises_them_alike() -> None:
    """8-bit pixels on the wire (a quarter of float32's bytes) with the constants; the model
    service's on-device arithmetic gives exactly the front door's reference values."""
    import torch

    from model_service.image_rows import image_pixels
    from radixmesh_wire.images import pixel_values
    from radixmesh_wire.step_codec import image_from_proto, image_to_proto

    prepared = prepare(png(50, 30, seed=3), SPEC, ImageBounds())
    assert prepared.pixels.dtype == np.uint8
    (im,) = place([299], [prepared], SPEC, 300)[1]
    assert len(im.pixels) == 3 * 28 * 28 and im.normalize == SPEC.normalize and not im.check()
    im = image_from_proto(image_to_proto(im))  # float32 constants on the wire
    want = prepared.values(SPEC)
    assert np.array_equal(pixel_values(im)[0], want)
    assert torch.equal(image_pixels(im, torch.device("cpu"))[0], torch.from_numpy(want))
