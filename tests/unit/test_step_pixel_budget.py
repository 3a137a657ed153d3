"""A step's admissions carry at most MAX_STEP_PIXEL_BYTES of image pixels beyond the first
admission (the rest wait a step), and an admission leaves out the images wholly inside its
cached prefix: many image requests at once, or many cache hits, can no longer build a step
message over the 32 MiB bound (which closed the model link and failed every request)."""

from __future__ import annotations

from radixmesh_wire.images import MAX_STEP_PIXEL_BYTES, ImageInput, images_after, pixel_bytes
from scheduler_service.cache.allocator import SlotAllocator
from scheduler_service.cache.radix_cache import RadixCache
from scheduler_service.planner.prefill_adder import admit_prefills
from tests.unit.queue_item import Item

MB = 1024 * 1024


def _image(offset: int, n: int, nbytes: int) -> ImageInput:
    return ImageInput(offset, n, 5000 + offset, b"\0" * nbytes, (3, 1, nbytes // 3))


def _admit(sizes: list[int], budget: int) -> tuple[list[int], str]:
    items = [Item([i * 100 + j for j in range(8)], i) for i in range(len(sizes))]
    cache = RadixCache(SlotAllocator(1000, debug=True))
    plan = admit_prefills(
        items,
        cache,
        chunk_budget=1000,
        max_running=100,
        num_running=0,
        payload=lambda w, cached: sizes[w.arrival],
        payload_budget=budget,
    )
    return [a.item.arrival for a in plan.admitted], plan.stop_reason


def test_admissions_stop_at_the_step_pixel_budget() -> None:
    assert _admit([10 * MB, 10 * MB, 10 * MB, 1 * MB], 24 * MB) == ([0, 1], "payload")


def test_the_first_admission_always_goes_whatever_its_size() -> None:
    assert _admit([24 * MB, 1], 1 * MB) == ([0], "payload")  # progress: never stuck


def test_text_only_requests_are_not_held_back() -> None:
    assert _admit([20 * MB, 0, 0, 0], 1 * MB) == ([0, 1, 2, 3], "drained")


def test_cached_images_are_left_out_of_the_admission() -> None:
    a, b = _image(2, 4, 3 * MB), _image(10, 4, 3 * MB)
    assert images_after((a, b), 0) == (a, b)
    assert images_after((a, b), 6) == (b,)  # a ends at 6: all of it cached
    assert images_after((a, b), 12) == (b,)  # b only partly cached: still needed
    assert images_after((a, b), 14) == ()
    assert pixel_bytes((a, b), 6) == 3 * MB and pixel_bytes((a, b)) == 6 * MB
    assert MAX_STEP_PIXEL_BYTES <= 24 * MB
