"""LLaVA-NeXT's any-resolution preprocessing, as transformers' LlavaNextImageProcessor does it
(its PIL backend; checked against it in tests/unit/test_image_anyres.py).

An image of (height, width) goes to the best of the model's grid pinpoints
(`image_geometry.select_best_resolution`): resized with its aspect ratio kept so that it
fits, padded with zeros (black, before normalising) centred to the pinpoint, and cut into
tiles of the tower's side in row-major order. Before the tiles comes the base tile: the whole
image resized to one tile (aspect not kept). Every tile then takes the model's usual steps
(resize the shortest edge, centre crop: `images._resize_crop`), which leave a tile of the
right size unchanged; rescaling and normalising follow in the model service, on 8-bit pixels.

Bounded: the tiles per image are a property of the model (its pinpoints; the spec refuses
a model with more than `MAX_TILES`), and the pixels decoded are bounded before this runs.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np

from radixmesh_wire.image_geometry import AnyresGeometry, select_best_resolution

MAX_TILES = 50  # per image, base tile included (LLaVA-NeXT's pinpoints give at most 5)


def check_tiles(geometry: AnyresGeometry) -> None:
    most = max(1 + (h // geometry.tile) * (w // geometry.tile) for h, w in geometry.pinpoints)
    if most > MAX_TILES:
        raise ValueError(
            f"image_grid_pinpoints give up to {most} tiles per image; at most {MAX_TILES} are "
            "served (each tile is one vision tower pass)"
        )


def fit_size(size: tuple[int, int], target: tuple[int, int]) -> tuple[int, int]:
    """The (height, width) an image of `size` is resized to inside `target`, aspect kept
    (HF's `get_patch_output_size`)."""
    oh, ow = size
    th, tw = target
    scale_w, scale_h = tw / ow, th / oh
    if scale_w < scale_h:
        return min(math.ceil(oh * scale_w), th), tw
    return th, min(math.ceil(ow * scale_h), tw)


def anyres_tiles(
    img: object,
    geometry: AnyresGeometry,
    base: tuple[int, int],
    finish: Callable[[object], np.ndarray],
) -> np.ndarray:
    """uint8 [tiles, 3, S, S]: the base tile (the image resized to `base` (height,
    width)) then the grid's tiles; `finish` turns one PIL tile into its [3, S, S] pixels."""
    from PIL import Image

    assert isinstance(img, Image.Image)
    w, h = img.size
    target = select_best_resolution((h, w), geometry.pinpoints)
    nh, nw = fit_size((h, w), target)
    resized = np.asarray(img.resize((nw, nh), Image.Resampling.BICUBIC))
    top, rem_y = divmod(target[0] - nh, 2)
    left, rem_x = divmod(target[1] - nw, 2)
    padded = np.pad(resized, ((top, top + rem_y), (left, left + rem_x), (0, 0)))
    s = geometry.tile
    tiles = [img.resize((base[1], base[0]), Image.Resampling.BICUBIC)]
    tiles += [
        Image.fromarray(np.ascontiguousarray(padded[i : i + s, j : j + s]))
        for i in range(0, target[0], s)
        for j in range(0, target[1], s)
    ]
    return np.stack([finish(t) for t in tiles])
