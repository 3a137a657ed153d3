"""Image features for a step: which rows of the step's tokens are image positions, and the
features to write there (LLaVA; see models/llava.py).

A request's images arrive once, in its ADMIT (`AdmitOp.images`), and stay with its runner
state (`RequestImages`). A row (admit or extend chunk) covering positions [start, start + n)
takes the features of every image overlapping that span; an image split over two prefill
chunks is encoded once (its features are kept until its last position has been written, then
dropped). The images of all rows of a step that need encoding go through the vision tower as
one batch.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

import numpy as np
import torch

from radixmesh_wire.image_geometry import ImageGeometry, image_problem
from radixmesh_wire.images import ImageInput


class VisionModel(Protocol):
    tokens_per_image: int

    def encode_images(
        self, images: list[ImageInput], device: torch.device
    ) -> list[torch.Tensor]: ...


@dataclass
class RequestImages:
    images: tuple[ImageInput, ...]
    feats: dict[int, torch.Tensor] = field(default_factory=dict)  # by image index, while needed


@dataclass(frozen=True)
class RowSpan:
    """One row of a step: its request's images, first position, token count, and its first
    row index among the step's tokens."""

    images: RequestImages
    start: int
    n: int
    cursor: int


def check_images(
    images: tuple[ImageInput, ...], per_image: int, geometry: ImageGeometry | None = None
) -> str:
    """'' if the images fit the model, else what is wrong. With the model's `geometry`, each
    image's token count and pixel shape must be what its size gives (any-resolution models:
    LLaVA-NeXT), so a bad image cannot fail the forward pass of a whole step."""
    end = -1
    for im in images:
        bad = im.check()
        if bad:
            return bad
        if geometry is not None:
            bad = image_problem(im.n_tokens, im.image_size, im.shape, geometry)
            if bad:
                return bad
        elif im.n_tokens != per_image:
            return f"an image of {im.n_tokens} tokens; this model's images have {per_image}"
        if im.offset < end:
            return "images overlap or are out of order"
        end = im.offset + im.n_tokens
    return ""


def step_image_rows(
    model: VisionModel, spans: list[RowSpan], device: torch.device
) -> tuple[torch.Tensor, torch.Tensor] | None:
    """(rows [K], features [K, hidden]) for every image position in `spans`, or None."""
    todo: list[tuple[RequestImages, int]] = []
    for sp in spans:
        for i, im in enumerate(sp.images.images):
            if _overlap(im, sp) and i not in sp.images.feats:
                todo.append((sp.images, i))
    if todo:
        feats = model.encode_images([ri.images[i] for ri, i in todo], device)
        for (ri, i), f in zip(todo, feats, strict=True):
            ri.feats[i] = f
    rows: list[int] = []
    parts: list[torch.Tensor] = []
    for sp in spans:
        for i, im in enumerate(sp.images.images):
            lo, hi = max(im.offset, sp.start), min(im.offset + im.n_tokens, sp.start + sp.n)
            if lo >= hi:
                continue
            rows.extend(range(sp.cursor + lo - sp.start, sp.cursor + hi - sp.start))
            parts.append(sp.images.feats[i][lo - im.offset : hi - im.offset])
            if hi == im.offset + im.n_tokens:
                del sp.images.feats[i]  # its last position is written: not needed again
    if not rows:
        return None
    return torch.tensor(rows, dtype=torch.int64, device=device), torch.cat(parts)


def _overlap(im: ImageInput, sp: RowSpan) -> bool:
    return im.offset < sp.start + sp.n and sp.start < im.offset + im.n_tokens


def image_pixels(im: ImageInput, device: torch.device) -> torch.Tensor:
    """The image's tiles, float32 [tiles, 3, H, W] (one tile for fixed-size models). 8-bit
    pixels are moved as bytes and normalised on the device, in float32 and in the order of
    `radixmesh_wire.images.normalise` (the same values)."""
    c, h, w = im.shape
    if not im.normalize:
        arr = np.frombuffer(im.pixels, dtype=np.float32).reshape(c // 3, 3, h, w)
        return torch.from_numpy(arr.copy()).to(device)
    u8 = np.frombuffer(im.pixels, dtype=np.uint8).reshape(c // 3, 3, h, w)
    x = torch.from_numpy(u8.copy()).to(device).to(torch.float32)
    rescale, mean, std = (
        torch.tensor(v, dtype=torch.float32, device=device)
        for v in (im.normalize[0], im.normalize[1:4], im.normalize[4:7])
    )
    return (x * rescale - mean[:, None, None]) / std[:, None, None]


def uncovered_pseudo_ids(ids: torch.Tensor, rows: torch.Tensor | None, vocab_size: int) -> int:
    """How many ids >= vocab_size get no image feature (must be 0)."""
    mask = ids >= vocab_size
    if rows is not None:
        mask[rows] = False
    return int(mask.sum())
