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
    if tile <= 0 or patch <= 0 or tile % patch:
        raise ValueError(f"vision image_size {tile} is not a multiple of patch_size {patch}")
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
