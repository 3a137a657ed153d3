"""The model worker's own checks of a step, before the runner changes any state.

The worker does not trust its session: a step from a buggy or hostile client must fail alone,
with a message naming what is wrong, leave the worker's per-request state untouched (so a
refused step has no effect) and never allocate by a number the client chose (a handle of 10**7
once grew the handle table by ~150 MB). Pure: reads the runner's state, changes nothing.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

import numpy as np

from model_service.image_rows import check_images
from model_service.runner_state import RequestState, StepError
from radixmesh_wire.image_geometry import ImageGeometry
from radixmesh_wire.images import ImageInput
from radixmesh_wire.step_ops import Sampling, StepOps


@dataclass(frozen=True)
class StepLimits:
    vocab_size: int
    kv_capacity: int  # slot ids are 0..kv_capacity-1
    context_length: int  # most tokens (KV slots) one request may hold
    max_handles: int  # handle ids are 0..max_handles-1
    host_kv_capacity: int = 0  # host slot ids are 0..host_kv_capacity-1 (0: no host tier)
    image_tokens: int = 0  # tokens per image (multimodal models); 0: images are refused
    # The model's image layout (any-resolution models: tokens and pixels by image size).
    image_geometry: ImageGeometry | None = None


def _in_range(what: str, values: Iterable[int], hi: int) -> None:
    # min/max in C for lists; the loop only to name the culprit (or for other iterables)
    if isinstance(values, list | tuple) and (not values or (min(values) >= 0 and max(values) < hi)):
        return
    for v in values:
        if not 0 <= v < hi:
            raise StepError(f"{what} {v} is outside [0, {hi})")


def _check_token_ids(
    h: int, ids: list[int], start: int, images: tuple[ImageInput, ...], vocab: int
) -> None:
    """Ids below the vocabulary, except at an image's positions, which hold its pseudo id."""
    if not images and (not ids or (min(ids) >= 0 and max(ids) < vocab)):
        return  # the common case in C; the loop below names the culprit
    at: dict[int, int] = {}
    for im in images:
        for p in range(max(im.offset, start), min(im.offset + im.n_tokens, start + len(ids))):
            at[p] = im.pseudo_id
    for i, t in enumerate(ids):
        want = at.get(start + i)
        if want is None and not 0 <= t < vocab:
            raise StepError(f"handle {h}: token id {t} is outside [0, {vocab})")
        if want is not None and t != want:
            raise StepError(f"handle {h}: position {start + i} holds {t}, not its image's id")


def _check_admit_images(h: int, images: tuple[ImageInput, ...], lim: StepLimits) -> None:
    if not images:
        return
    if not lim.image_tokens:
        raise StepError(f"handle {h}: images for a text-only model")
    bad = check_images(images, lim.image_tokens, lim.image_geometry)
    if bad:
        raise StepError(f"handle {h}: {bad}")
    if any(im.pseudo_id < lim.vocab_size for im in images):
        raise StepError(f"handle {h}: an image id inside the vocabulary")


def _check_sampling(handle: int, s: Sampling, lim: StepLimits) -> None:
    if not (math.isfinite(s.temperature) and s.temperature >= 0):
        raise StepError(f"handle {handle}: temperature {s.temperature} is not finite and >= 0")
    if not (math.isfinite(s.top_p) and 0 < s.top_p <= 1):
        raise StepError(f"handle {handle}: top_p {s.top_p} is outside (0, 1]")
    if not (math.isfinite(s.min_p) and 0 <= s.min_p <= 1):
        raise StepError(f"handle {handle}: min_p {s.min_p} is outside [0, 1]")
    if not 0 <= s.top_logprobs <= lim.vocab_size:
        raise StepError(f"handle {handle}: top_logprobs {s.top_logprobs} is outside [0, vocab]")
    if s.min_new_tokens < 0 or s.prompt_logprobs_from < -1:
        raise StepError(f"handle {handle}: negative min_new_tokens or prompt_logprobs_from")
    _in_range(f"handle {handle}: stop id", s.stop_ids, lim.vocab_size)
    pens = (s.presence_penalty, s.frequency_penalty, s.repetition_penalty)
    if not all(math.isfinite(x) for x in pens) or s.repetition_penalty <= 0:
        raise StepError(f"handle {handle}: penalties must be finite (repetition > 0)")
    _in_range(f"handle {handle}: logit_bias id", (t for t, _ in s.logit_bias), lim.vocab_size)
    if not all(math.isfinite(b) for _, b in s.logit_bias):
        raise StepError(f"handle {handle}: logit_bias values must be finite")
    _in_range(f"handle {handle}: penalty history id", s.penalty_history, lim.vocab_size)


def _check_copies(ops: StepOps, lim: StepLimits) -> None:
    """Host-tier copies: a host pool exists, as many sources as destinations, every id in
    its pool, no destination twice in one copy (the result would depend on write order)."""
    for i, c in enumerate(ops.copies):
        what = f"KV copy {i} ({'save' if c.to_host else 'load'})"
        if not lim.host_kv_capacity:
            raise StepError(f"{what}: this model service has no host KV pool (--host-kv-tokens)")
        if len(c.src) != len(c.dst):
            raise StepError(f"{what}: {len(c.src)} source slots for {len(c.dst)} destinations")
        gpu, host = (c.src, c.dst) if c.to_host else (c.dst, c.src)
        _in_range(f"{what}: slot", gpu, lim.kv_capacity)
        _in_range(f"{what}: host slot", host, lim.host_kv_capacity)
        if len(set(c.dst)) != len(c.dst):
            raise StepError(f"{what}: a destination slot appears twice")


def validate_step(ops: StepOps, requests: Mapping[int, RequestState], lim: StepLimits) -> None:
    """Raise StepError unless every operation of `ops` is consistent with `requests` (the
    runner's state) and `lim`. Mirrors the order `ModelRunner.launch` applies them in:
    releases, truncates, then admits, extends and decodes."""
    _in_range("released handle", ops.releases, lim.max_handles)
    _in_range("freed slot", ops.freed_slots, lim.kv_capacity)
    _check_copies(ops, lim)
    live = set(requests) - set(ops.releases)
    # Sequence lengths as the step changes them, filled on first use (a decode-only step
    # needs none: building them for every live request cost more than the decode rows' check).
    lengths: dict[int, int] = {}

    def length(h: int) -> int:
        n = lengths.get(h)
        if n is None:
            n = len(requests[h].slots) if h in live else 0
        return n

    truncated = _check_truncates(ops, live, lengths, length)
    rows: set[int] = set()
    step_tokens = 0

    def row(
        h: int, ids: list[int] | None, slots: list[int], images: tuple[ImageInput, ...] = ()
    ) -> None:
        nonlocal step_tokens
        if h in rows:
            raise StepError(f"handle {h} has two rows in one step")
        rows.add(h)
        if ids is not None:
            if not ids or len(ids) != len(slots):
                raise StepError(f"handle {h}: {len(ids)} ids for {len(slots)} slots")
            _check_token_ids(h, ids, length(h), images, lim.vocab_size)
        _in_range(f"handle {h}: slot", slots, lim.kv_capacity)
        lengths[h] = length(h) + len(slots)
        if lengths[h] > lim.context_length:
            raise StepError(
                f"handle {h}: {lengths[h]} tokens exceed the context length {lim.context_length}"
            )
        step_tokens += len(slots)
        if step_tokens > lim.kv_capacity:
            raise StepError(f"the step writes more slots than the KV pool has ({lim.kv_capacity})")

    for a in ops.admits:
        _in_range("admitted handle", [a.handle], lim.max_handles)
        if a.handle in live:
            raise StepError(f"handle {a.handle} admitted twice")
        _check_sampling(a.handle, a.sampling, lim)
        _in_range(f"handle {a.handle}: prefix slot", a.prefix_slots, lim.kv_capacity)
        _check_admit_images(a.handle, a.images, lim)
        lengths[a.handle] = len(a.prefix_slots)
        row(a.handle, a.input_ids, a.slots, a.images)
    admitted = {a.handle for a in ops.admits}
    for e in ops.extends:
        if e.handle not in live:
            raise StepError(f"extend of unknown handle {e.handle}")
        imgs = requests[e.handle].images if e.handle in requests else None
        row(e.handle, e.input_ids, e.slots, imgs.images if imgs is not None else ())
    if len(ops.decode_handles) != len(ops.decode_slots):
        raise StepError(
            f"{len(ops.decode_handles)} decode handles for {len(ops.decode_slots)} slots"
        )
    if _decodes_ok(ops, requests, lim, live, rows | truncated, step_tokens):
        return
    # Something is wrong with a decode row: the same checks row by row, to say which.
    _check_decodes_by_row(ops, requests, live, admitted, truncated, row)


def rows_touching_loads(
    ops: StepOps, requests: Mapping[int, RequestState], kv_capacity: int
) -> str | None:
    """Load-ahead (issue 31): a step's host -> GPU loads may run beside its forward pass only
    if no row of it reads or writes a slot they write; the runner then makes the NEXT step
    wait for them. This names the first row that does ("handle H, GPU slot S"), else None; the
    runner makes such a step wait for its loads before its forward pass, as before load-ahead
    (what a scheduler without load-ahead sends). A row's reads are its sequence's slots (after
    this step's truncates), its writes its new slots. Call it on a validated step, before the
    runner applies it; one boolean mask over the pool, only for steps with loads."""
    loads = [c for c in ops.copies if not c.to_host] if ops.copies else None
    if not loads:
        return None
    mask = np.zeros(kv_capacity, dtype=np.bool_)
    for c in loads:
        mask[c.dst] = True
    cut = dict(ops.truncates)  # in order: the last one per handle is the shortest

    def hit(h: int, slots: np.ndarray | list[int]) -> str | None:
        idx = np.asarray(slots, dtype=np.int64)
        on = mask[idx]
        return f"handle {h}, GPU slot {int(idx[on.argmax()])}" if on.any() else None

    def seq(h: int) -> np.ndarray:
        view = requests[h].slots.view()
        return view[: cut[h]] if h in cut else view

    found = [hit(a.handle, a.prefix_slots) or hit(a.handle, a.slots) for a in ops.admits]
    found += [hit(e.handle, seq(e.handle)) or hit(e.handle, e.slots) for e in ops.extends]
    found += [hit(h, seq(h)) for h in ops.decode_handles]
    if ops.decode_slots:
        found += [hit(h, [s]) for h, s in zip(ops.decode_handles, ops.decode_slots, strict=True)]
    return next((f for f in found if f is not None), None)


def _check_truncates(
    ops: StepOps, live: set[int], lengths: dict[int, int], length: Callable[[int], int]
) -> set[int]:
    """Truncates, in order, against the sequence lengths (`lengths`, as the step changes them;
    `length`: a handle's length so far). Returns the truncated handles."""
    truncated: set[int] = set()
    for h, length_to in ops.truncates:
        if h not in live:
            raise StepError(f"truncate of unknown handle {h}")
        lengths[h] = length(h)
        if length_to > lengths[h]:
            raise StepError(f"handle {h}: truncate to {length_to} of a {lengths[h]}-token sequence")
        lengths[h] = length_to
        truncated.add(h)
    return truncated


def _check_decodes_by_row(
    ops: StepOps,
    requests: Mapping[int, RequestState],
    live: set[int],
    admitted: set[int],
    truncated: set[int],
    row: Callable[[int, list[int] | None, list[int]], None],
) -> None:
    """The decode rows one by one (`row`: validate_step's per-row check), to name the bad one."""
    for h, slot in zip(ops.decode_handles, ops.decode_slots, strict=True):
        if h not in live:
            raise StepError(
                f"decode of {'a just admitted' if h in admitted else 'unknown'} handle {h}"
            )
        if not requests[h].has_token or h in truncated:
            raise StepError(f"decode for handle {h} with no sampled token")
        row(h, None, [slot])


def _decodes_ok(
    ops: StepOps,
    requests: Mapping[int, RequestState],
    lim: StepLimits,
    live: set[int],
    taken: set[int],
    step_tokens: int,
) -> bool:
    """Every decode row passes the per-row checks of `validate_step`, checked for the whole
    set at once (set algebra and min/max in C, one pass for the per-request fields): a decode
    row runs for every running request every step. `taken`: handles with another row this
    step or truncated (neither may decode). False means only "look row by row"."""
    handles, slots = ops.decode_handles, ops.decode_slots
    if not handles:
        return True
    hs = set(handles)
    if len(hs) != len(handles) or not hs <= live or not hs.isdisjoint(taken):
        return False
    if min(slots) < 0 or max(slots) >= lim.kv_capacity:
        return False
    if step_tokens + len(handles) > lim.kv_capacity:
        return False
    ctx = lim.context_length  # a decode adds one token: the sequence must be shorter
    return all((st := requests[h]).has_token and len(st.slots) < ctx for h in handles)
