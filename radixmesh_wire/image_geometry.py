"""How many sequence positions an image takes in a LLaVA-family model, and in what pixel shape
it travels: one pure answer shared by the front door (which writes the placeholders, as HF's
processors do) and the model service (which checks what it receives and lays the features out).

A vision tower turns one square tile of `tile` pixels into (tile / patch)^2 patch features,
plus a CLS feature for CLIP (SigLIP has none); the "default" select strategy drops the first
feature (CLS for CLIP, as HF's LlavaModel drops it whatever the tower). LLaVA-1.5 sends one
tile per image. Pure: no torch, no protobuf.
"""

from __future__ import annotations

from dataclasses import dataclass

# The vision towers we run, by their HF `vision_config.model_type`: whether it emits a CLS
# feature before the patch features. The model service builds these classes (models/llava.py).
TOWER_HAS_CLS = {"clip_vision_model": True, "siglip_vision_model": False}
SELECT_STRATEGIES = ("default", "full")


def tile_tokens(tower: str, tile: int, patch: int, strategy: str) -> int:
    """Features one tile yields after the select strategy. ValueError names what is wrong."""
    if tower not in TOWER_HAS_CLS:
        raise ValueError(
            f"vision tower {tower!r} is not supported (supported: {', '.join(TOWER_HAS_CLS)})"
        )
    if strategy not in SELECT_STRATEGIES:
        raise ValueError(
            f"vision_feature_select_strategy {strategy!r} is not one of {SELECT_STRATEGIES}"
        )
    if tile < patch or patch <= 0:
        raise ValueError(f"vision image_size {tile} is smaller than patch_size {patch}")
    # floor: the patch convolution's stride drops a partial patch (SigLIP-so400m: 384 / 14)
    n = (tile // patch) ** 2 + (1 if TOWER_HAS_CLS[tower] else 0)
    return n - (1 if strategy == "default" else 0)


@dataclass(frozen=True)
class ImageGeometry:
    """A model's image layout. `tile`: the tower's input side in pixels; `tile_tokens`: the
    features of one tile (`tile_tokens()`)."""

    tile: int
    tile_tokens: int

    def tiles(self, size: tuple[int, int]) -> int:
        """Tiles an image of `size` (height, width) is sent as."""
        return 1

    def tokens(self, size: tuple[int, int]) -> int:
        """Placeholder positions of an image of `size` (height, width)."""
        return self.tile_tokens

    def max_tokens(self) -> int:
        """The most positions any image takes."""
        return self.tile_tokens

    def pixel_shape(self, size: tuple[int, int]) -> tuple[int, int, int]:
        """The float32 pixels' shape on the wire: the tiles' channels stacked."""
        return (3 * self.tiles(size), self.tile, self.tile)


def select_best_resolution(
    size: tuple[int, int], pinpoints: tuple[tuple[int, int], ...]
) -> tuple[int, int]:
    """The (height, width) of `pinpoints` an image of `size` (height, width) fits best: the
    most of its pixels kept, then the least padding (HF's `select_best_resolution`, the same
    float arithmetic, so the same choice on ties)."""
    oh, ow = size
    best = pinpoints[0]
    most, least = 0, float("inf")
    for h, w in pinpoints:
        scale = min(w / ow, h / oh)
        effective = min(int(ow * scale) * int(oh * scale), ow * oh)
        wasted = w * h - effective
        if effective > most or (effective == most and wasted < least):
            most, least, best = effective, wasted, (h, w)
    return best


def unpadded(size: tuple[int, int], current: tuple[int, int]) -> tuple[int, int, int, int]:
    """(top, bottom, left, right) rows/columns of a `current` (height, width) feature grid
    that hold the image of `size` (height, width) rather than the padding around it (HF's
    `unpad_image`, the same rounding)."""
    oh, ow = size
    ch, cw = current
    if ow / oh > cw / ch:
        new_h = int(round(oh * (cw / ow), 7))
        pad = (ch - new_h) // 2
        return pad, ch - pad, 0, cw
    new_w = int(round(ow * (ch / oh), 7))
    pad = (cw - new_w) // 2
    return 0, ch, pad, cw - pad


@dataclass(frozen=True)
class AnyresGeometry(ImageGeometry):
    """LLaVA-NeXT's any-resolution layout: an image is resized (aspect kept) and padded to the
    best of `pinpoints` (height, width), cut into tiles, and sent as a base tile (the whole
    image resized to one tile) plus the grid's tiles in row-major order. Its positions: the
    base tile's features, then the grid's features with the padding's rows/columns dropped,
    each row followed by one newline feature."""

    pinpoints: tuple[tuple[int, int], ...] = ()
    side: int = 0  # patches along a tile's side (tile / patch)

    def __post_init__(self) -> None:
        if not self.pinpoints:
            raise ValueError("an any-resolution model needs image_grid_pinpoints")
        for h, w in self.pinpoints:
            if h <= 0 or w <= 0 or h % self.tile or w % self.tile:
                raise ValueError(
                    f"image_grid_pinpoints entry {[h, w]} is not a multiple of the tile {self.tile}"
                )
        if self.tile_tokens != self.side * self.side:
            raise ValueError(
                f"a tile yields {self.tile_tokens} features, not {self.side}^2: any-resolution "
                "models need one feature per patch (CLIP with 'default', SigLIP with 'full')"
            )

    def grid(self, size: tuple[int, int]) -> tuple[int, int]:
        """(rows, columns) of tiles for an image of `size` (height, width)."""
        h, w = select_best_resolution(size, self.pinpoints)
        return h // self.tile, w // self.tile

    def tiles(self, size: tuple[int, int]) -> int:
        rows, cols = self.grid(size)
        return 1 + rows * cols

    def tokens(self, size: tuple[int, int]) -> int:
        rows, cols = self.grid(size)
        top, bottom, left, right = unpadded(size, (rows * self.side, cols * self.side))
        return self.tile_tokens + (bottom - top) * (right - left + 1)

    def max_tokens(self) -> int:
        return self.tile_tokens + max(
            (h // self.tile * self.side) * (w // self.tile * self.side + 1)
            for h, w in self.pinpoints
        )


def image_problem(
    n_tokens: int, image_size: tuple[int, int], shape: tuple[int, ...], geometry: ImageGeometry
) -> str:
    """'' if an image of `image_size` (height, width) sent as `n_tokens` placeholders and
    pixels of `shape` fits `geometry`, else what is wrong. The scheduler (at submit) and the
    model service (every admission) both ask this, so an image the scheduler accepted never
    fails a step that other requests share."""
    if geometry.max_tokens() != geometry.tile_tokens and min(image_size) <= 0:
        return "an image without its size: this model lays out images by their size"
    want = geometry.tokens(image_size)
    if n_tokens != want:
        return f"an image of {n_tokens} tokens; this model's images of this size have {want}"
    expect = geometry.pixel_shape(image_size)
    if tuple(shape) != expect:
        return f"pixels of shape {tuple(shape)}; this model takes {expect} for this image"
    return ""
