"""The model's image layout travels in WorkerInfo (`image_layout`), and the scheduler checks each
image with it exactly as the model service does (`image_geometry.image_problem`): an
any-resolution (LLaVA-NeXT) image of any size is accepted with its own count, a count or pixel
shape that does not match its size is refused at submit, alone, before it can fail a step."""

from __future__ import annotations

import pytest

from radixmesh_wire.image_geometry import AnyresGeometry, ImageGeometry
from radixmesh_wire.images import ImageInput
from radixmesh_wire.pb import model_pb2
from radixmesh_wire.step_codec import decode_worker_info, layout_from_proto, layout_to_proto
from scheduler_service.request import Request, SamplingSpec
from scheduler_service.status import Status
from scheduler_service.submit_validation import SubmitError, SubmitLimits, validate_submit

VOCAB, PID = 100, 1234
GEO = AnyresGeometry(4, 4, pinpoints=((4, 8), (8, 4), (8, 8)), side=2)


def _image(size: tuple[int, int], n: int | None = None) -> ImageInput:
    shape = GEO.pixel_shape(size)
    c, h, w = shape
    n = GEO.tokens(size) if n is None else n
    return ImageInput(1, n, PID, b"\0" * (4 * c * h * w), shape, image_size=size)


def _submit(im: ImageInput, geometry: ImageGeometry | None = GEO) -> None:
    prompt = [5, *[PID] * im.n_tokens, 6]
    spec = SamplingSpec(max_new_tokens=4)
    req = Request("r", "s", prompt, spec, frozenset(), key=1, images=(im,))
    limits = SubmitLimits(VOCAB, 1000, 5000, 20, GEO.max_tokens(), geometry)
    validate_submit(req, limits)


@pytest.mark.parametrize("size", [(30, 60), (60, 30), (50, 50), (7, 300)])
def test_images_of_every_size_are_accepted_with_their_own_count(size: tuple[int, int]) -> None:
    _submit(_image(size))


def test_the_counts_differ_by_size_so_a_fixed_count_could_not_check_them() -> None:
    assert len({GEO.tokens(s) for s in [(30, 60), (60, 30), (50, 50), (7, 300)]}) > 1


@pytest.mark.parametrize(
    ("im", "says"),
    [
        (_image((7, 300), n=GEO.max_tokens()), "images of this size have"),
        (_image((50, 50), n=GEO.tokens((50, 50)) - 1), "images of this size have"),
        (ImageInput(1, 20, PID, b"\0" * 4 * 3 * 16, (3, 4, 4), (0, 0)), "without its size"),
        (
            ImageInput(1, GEO.tokens((50, 50)), PID, b"\0" * 4 * 3 * 16, (3, 4, 4), (50, 50)),
            "pixels of shape",
        ),
    ],
)
def test_a_mismatched_image_is_refused_at_submit(im: ImageInput, says: str) -> None:
    with pytest.raises(SubmitError, match=says) as err:
        _submit(im)
    assert err.value.code == Status.INVALID_ARGUMENT


def test_without_a_layout_the_scheduler_checks_the_fixed_count() -> None:
    with pytest.raises(SubmitError, match=f"images take {GEO.max_tokens()}"):
        _submit(_image((7, 300)), geometry=None)


@pytest.mark.parametrize("geo", [GEO, ImageGeometry(336, 576), None])
def test_worker_info_carries_the_layout(geo: ImageGeometry | None) -> None:
    info = model_pb2.WorkerInfo(image_tokens=9, image_layout=layout_to_proto(geo))
    decoded = decode_worker_info(model_pb2.WorkerInfo.FromString(info.SerializeToString()))
    assert decoded.image_geometry == geo


def test_a_broken_layout_from_a_peer_is_refused() -> None:
    msg = layout_to_proto(GEO)
    del msg.pinpoints[-1]
    with pytest.raises(ValueError, match="pairs"):
        layout_from_proto(msg)
    msg = layout_to_proto(GEO)
    msg.pinpoints[0] = 5  # not a multiple of the tile
    with pytest.raises(ValueError, match="multiple of the tile"):
        layout_from_proto(msg)
