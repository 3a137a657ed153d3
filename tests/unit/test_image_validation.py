"""Images are checked by every service that receives them (issue 32): the scheduler's submit
validation and the model service's step validation refuse images for a text-only model, ids
at or above the vocabulary outside an image's positions, positions that do not hold the
image's pseudo id, and images of the wrong size; the codec carries images unchanged."""

from __future__ import annotations

import pytest

from model_service.runner import StepError
from model_service.step_validation import StepLimits, validate_step
from radixmesh_wire.images import ImageInput
from radixmesh_wire.step_codec import decode_step, encode_step
from radixmesh_wire.step_ops import AdmitOp, Sampling, StepOps
from scheduler_service.request import Request, SamplingSpec
from scheduler_service.submit_validation import SubmitError, SubmitLimits, validate_submit

VOCAB, PID = 100, 1234
PIXELS = b"\0" * (4 * 3 * 2 * 2)


def _image(offset: int = 1, n: int = 4, pid: int = PID) -> ImageInput:
    return ImageInput(offset, n, pid, PIXELS, (3, 2, 2))


def _ids(pid: int = PID) -> list[int]:
    return [5, pid, pid, pid, pid, 6]


# -- scheduler ---------------------------------------------------------------------------------

SLIM = SubmitLimits(VOCAB, 100, 500, 20, image_tokens=4)


def _req(prompt: list[int], images: tuple[ImageInput, ...], **kw: object) -> Request:
    spec = SamplingSpec(max_new_tokens=4, **kw)  # type: ignore[arg-type]
    return Request("r", "s", prompt, spec, frozenset(), key=1, images=images)


def test_scheduler_accepts_a_well_formed_image_request() -> None:
    validate_submit(_req(_ids(), (_image(),)), SLIM)


@pytest.mark.parametrize(
    ("prompt", "images", "lim", "says"),
    [
        (_ids(), (_image(),), SubmitLimits(VOCAB, 100, 500, 20), "text-only"),
        (_ids(), (), SLIM, "outside the vocabulary"),  # pseudo ids with no image
        ([5, PID, PID, 7, PID, 6], (_image(),), SLIM, "does not hold the image's id"),
        (_ids(), (_image(n=3),), SLIM, "this model's images take 4"),
        (_ids(50), (_image(pid=50),), SLIM, "not above the vocabulary"),
        (_ids(), (_image(offset=4),), SLIM, "run past the prompt"),
    ],
)
def test_scheduler_refusals(
    prompt: list[int], images: tuple[ImageInput, ...], lim: SubmitLimits, says: str
) -> None:
    with pytest.raises(SubmitError, match=says):
        validate_submit(_req(prompt, images), lim)


def test_scheduler_refuses_prompt_logprobs_with_images() -> None:
    with pytest.raises(SubmitError, match="prompt logprobs"):
        validate_submit(_req(_ids(), (_image(),), prompt_logprobs_from=0), SLIM)


# -- model service -----------------------------------------------------------------------------

MLIM = StepLimits(VOCAB, 64, 32, 8, image_tokens=4)


def _step(ids: list[int], images: tuple[ImageInput, ...]) -> StepOps:
    admit = AdmitOp(0, Sampling(), 0, [], ids, list(range(len(ids))), True, images=images)
    return StepOps(1, admits=[admit])


def test_model_service_accepts_and_the_codec_carries_images() -> None:
    ops = _step(_ids(), (_image(),))
    validate_step(ops, {}, MLIM)
    back = decode_step(encode_step(ops))
    assert back.admits[0].images == ops.admits[0].images
    assert back.admits[0].input_ids == _ids()


@pytest.mark.parametrize(
    ("ids", "images", "lim", "says"),
    [
        (_ids(), (_image(),), StepLimits(VOCAB, 64, 32, 8), "text-only"),
        (_ids(), (), MLIM, "outside"),
        ([5, PID, PID, 7, PID, 6], (_image(),), MLIM, "not its image's id"),
        (_ids(), (_image(n=3),), MLIM, "images have 4"),
        (_ids(), (ImageInput(1, 4, PID, b"\0", (3, 2, 2)),), MLIM, "pixel bytes"),
    ],
)
def test_model_service_refusals(
    ids: list[int], images: tuple[ImageInput, ...], lim: StepLimits, says: str
) -> None:
    with pytest.raises(StepError, match=says):
        validate_step(_step(ids, images), {}, lim)
