"""Images in a token sequence: how they are keyed (pseudo ids) and what a step carries.

An image occupies `n_tokens` consecutive positions of a sequence (as many as the model's
vision tower yields features). Those positions hold one *pseudo id*, derived from a hash of
the image's content: an id at or above the vocabulary, never looked up in an embedding table,
used only as the radix tree's key. So two requests with the same image (and the same text
before it) share the prefix, different images never do, and the hash is computed once, where
the image enters (the front door). The model service replaces the embeddings at those
positions with the image's features.

Pseudo ids stay below 2**31 (the wire packs ids as int32).
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # numpy only where pixels are turned into values, not in the scheduler
    import numpy as np

ID_LIMIT = 2**31 - 1  # ids travel as int32

# Pixel bytes: one request's preprocessed pixels at most (the front door refuses more), and
# the most a step's admissions carry together beyond its first admission (the scheduler
# admits the rest next step). Both leave room under the 32 MiB message bound
# (services/server.py) for everything else a message holds, so neither a request nor a step
# with many images can fail to reach the model service.
MAX_REQUEST_PIXEL_BYTES = 24 * 1024 * 1024
MAX_STEP_PIXEL_BYTES = MAX_REQUEST_PIXEL_BYTES


def content_hash(data: bytes) -> bytes:
    """The image's key: SHA-256 of its preprocessed pixels (so two encodings of the same
    picture that preprocess alike share the cache)."""
    return hashlib.sha256(data).digest()


def pseudo_id(digest: bytes, vocab_size: int) -> int:
    """An id in [vocab_size, 2**31 - 1) from an image's content hash. Different images
    collide with probability about 1 / (2**31 - vocab_size) per pair."""
    span = ID_LIMIT - vocab_size
    if span <= 0:
        raise ValueError(f"vocabulary {vocab_size} leaves no room for image ids below 2**31")
    return vocab_size + int.from_bytes(digest[:8], "big") % span


@dataclass(frozen=True)
class ImageInput:
    """One image of a request, as the model service receives it (once, in its ADMIT).

    `offset`: the sequence position of its first placeholder token; `n_tokens` placeholders
    follow, each holding `pseudo_id`. `pixels`: C order, of `shape` (channels, height, width);
    an any-resolution model's tiles stack their channels (3 x tiles). Without `normalize` they
    are float32 values ready for the vision tower; with it, (rescale, mean[3], std[3]), they
    are 8-bit values (as the image processor has them before its last steps) which become
    `(x * rescale - mean) / std` per channel in float32 (`pixel_values`): 4x fewer bytes on
    every hop. `image_size`: the decoded image's (height, width), by which an any-resolution
    model lays out its features (radixmesh_wire/image_geometry.py); (0, 0) where the model
    does not need it."""

    offset: int
    n_tokens: int
    pseudo_id: int
    pixels: bytes
    shape: tuple[int, int, int]
    image_size: tuple[int, int] = (0, 0)
    normalize: tuple[float, ...] = ()

    def check(self) -> str:
        """'' if consistent, else what is wrong (the receiver refuses the step)."""
        c, h, w = self.shape
        width = 1 if self.normalize else 4
        if min(self.shape) <= 0 or c % 3 or len(self.pixels) != width * c * h * w:
            return f"{len(self.pixels)} pixel bytes for shape {self.shape}"
        if self.offset < 0 or self.n_tokens <= 0:
            return f"offset {self.offset}, {self.n_tokens} tokens"
        if min(self.image_size) < 0:
            return f"image size {self.image_size}"
        if self.normalize and (
            len(self.normalize) != 7
            or not all(math.isfinite(x) for x in self.normalize)
            or 0.0 in self.normalize[4:]
        ):
            return f"normalize {self.normalize} is not (rescale, 3 means, 3 non-zero stds)"
        return ""


def pixel_values(im: ImageInput) -> np.ndarray:
    """The image's float32 tiles [tiles, 3, H, W], normalised if it came as 8-bit values
    (the reference of the model service's on-device arithmetic)."""
    import numpy as np

    c, h, w = im.shape
    if not im.normalize:
        return np.frombuffer(im.pixels, np.float32).reshape(c // 3, 3, h, w)
    return normalise(np.frombuffer(im.pixels, np.uint8).reshape(c // 3, 3, h, w), im.normalize)


def normalise(x: np.ndarray, normalize: tuple[float, ...]) -> np.ndarray:
    """8-bit values [..., 3, H, W] -> float32 `(x * rescale - mean) / std` per channel, in
    float32 and in this order (as transformers' image processors do it)."""
    import numpy as np

    rescale, mean, std = normalize[0], normalize[1:4], normalize[4:7]
    scaled = x.astype(np.float32) * np.float32(rescale)
    mean32 = np.asarray(mean, np.float32)[:, None, None]
    return (scaled - mean32) / np.asarray(std, np.float32)[:, None, None]


def images_after(images: tuple[ImageInput, ...], cached: int) -> tuple[ImageInput, ...]:
    """The images an admission must carry when its first `cached` positions are already in
    the KV cache: those that end past it (the model service never encodes the others)."""
    return tuple(im for im in images if im.offset + im.n_tokens > cached)


def pixel_bytes(images: tuple[ImageInput, ...], cached: int = 0) -> int:
    """Bytes of pixels an admission with `cached` positions already in the cache carries."""
    return sum(len(im.pixels) for im in images if im.offset + im.n_tokens > cached)
