"""LLaVA-NeXT's feature layout for one image (HF's `LlavaNextModel.pack_image_features`,
"spatial_unpad"): the base tile's features, then the grid tiles' features joined into one
feature map, the rows/columns that only cover the padding dropped (`image_geometry.unpadded`),
and the `image_newline` feature after each row. The count equals
`AnyresGeometry.tokens(size)`, which the front door wrote as the image's placeholders.
"""

from __future__ import annotations

import torch

from radixmesh_wire.image_geometry import AnyresGeometry, unpadded


def pack_anyres(
    feats: torch.Tensor, size: tuple[int, int], geometry: AnyresGeometry, newline: torch.Tensor
) -> torch.Tensor:
    """feats [tiles, side^2, hidden] (the base tile first) -> [tokens(size), hidden]."""
    rows, cols = geometry.grid(size)
    s = geometry.side
    if feats.shape[0] != 1 + rows * cols:
        raise ValueError(f"{feats.shape[0]} tiles for an image of size {size}")
    hidden = feats.shape[-1]
    # [rows, cols, s, s, C] -> [C, rows, s, cols, s] -> one [C, rows * s, cols * s] map
    grid = feats[1:].view(rows, cols, s, s, hidden).permute(4, 0, 2, 1, 3)
    grid = grid.reshape(hidden, rows * s, cols * s)
    top, bottom, left, right = unpadded(size, (rows * s, cols * s))
    grid = grid[:, top:bottom, left:right]
    nl = newline.to(grid.dtype)[:, None, None].expand(hidden, grid.shape[1], 1)
    grid = torch.cat((grid, nl), dim=-1).flatten(1, 2).transpose(0, 1)
    return torch.cat((feats[0], grid), dim=0)
