"""Images where they enter: decoded, bounded, preprocessed and hashed once, at the front door.

`ImageSpec` is what the served model wants (read from its folder: config.json of a LLaVA
model and its preprocessor_config.json, as transformers' image processors read them);
`prepare` turns the bytes of one image into the model's pixels (convert to RGB, resize the
shortest edge and centre crop as CLIPImageProcessor does, or resize to a fixed size as
SiglipImageProcessor does; LLaVA-NeXT's any-resolution tiles: image_anyres.py). They stay
8-bit, as the processors have them before their last steps, and travel with the rescale and
normalisation constants (`ImageSpec.normalize`): the model service applies them in float32
(radixmesh_wire.images.normalise), so every hop carries a quarter of the bytes. The values
equal transformers' own processors' (tests/unit/test_image_prep.py, test_image_anyres.py).
`place` expands each image marker of a prompt into the image's placeholder positions holding
its hash-derived pseudo id (radixmesh_wire/images.py): as many as the model takes for an
image of that size (radixmesh_wire/image_geometry.py; for LLaVA-NeXT a function of the size,
as HF's processor computes it). Every failure is an `InvalidRequest` naming the image.

Bounds (--max-image-bytes, --max-image-pixels, --max-images: config.py): bytes per image,
decoded pixels per image (checked from the header, before decoding: a 20k x 20k PNG of a few
kB is refused without allocating 1.2 GB), images per request. Decoding runs in a worker
thread (the caller's job).
"""

from __future__ import annotations

import io
import json
import warnings
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from radixmesh_wire.image_geometry import AnyresGeometry, tile_tokens
from radixmesh_wire.images import (
    MAX_REQUEST_PIXEL_BYTES,
    ImageInput,
    content_hash,
    normalise,
    pseudo_id,
)
from tokenizer_service.image_anyres import anyres_tiles, check_tiles
from tokenizer_service.validation import InvalidRequest

FORMATS = ("PNG", "JPEG", "WEBP", "GIF", "BMP")


# The preprocessed pixels of one request travel to the scheduler and on to the model service
# in one message each: a request over radixmesh_wire.images.MAX_REQUEST_PIXEL_BYTES is refused
# here. (8-bit: LLaVA-1.5 at 336 pixels: 0.34 MB an image; LLaVA-NeXT at 336 with 5 tiles:
# 1.7 MB.)


@dataclass(frozen=True)
class ImageBounds:
    max_bytes: int = 20 * 1024 * 1024
    max_pixels: int = 40_000_000  # width x height of the decoded image
    max_images: int = 16  # per request


@dataclass(frozen=True)
class ImageSpec:
    """A multimodal model's image interface."""

    image_token_id: int  # the prompt's image marker (its text: `image_token`)
    image_token: str
    tokens_per_image: int
    shortest_edge: int  # resize the shortest edge to this; 0: resize to `crop` exactly
    crop: tuple[int, int]  # (height, width): the centre crop, or the exact size
    mean: tuple[float, float, float]
    std: tuple[float, float, float]
    rescale: float = 1 / 255
    anyres: AnyresGeometry | None = None  # LLaVA-NeXT: tiles and positions depend on the size
    base: tuple[int, int] = (0, 0)  # any-resolution: the base tile's (height, width) resize

    @property
    def normalize(self) -> tuple[float, ...]:
        """(rescale, mean[3], std[3]): what turns the 8-bit pixels into the tower's input, as
        the float32 values the arithmetic uses (so the wire's floats carry them exactly)."""
        return tuple(float(np.float32(x)) for x in (self.rescale, *self.mean, *self.std))

    @staticmethod
    def from_folder(folder: Path, token_text: str = "<image>") -> ImageSpec | None:
        """The spec of the LLaVA model in `folder`, or None for a text-only model.
        ValueError for a LLaVA whose vision tower or select strategy is not supported."""
        cfg_file = folder / "config.json"
        if not cfg_file.exists():
            return None
        cfg = json.loads(cfg_file.read_text())
        if cfg.get("model_type") not in ("llava", "llava_next"):
            return None
        vis = cfg.get("vision_config", {})
        side, patch = int(vis.get("image_size", 224)), int(vis.get("patch_size", 14))
        tower = vis.get("model_type", "clip_vision_model")
        strategy = cfg.get("vision_feature_select_strategy", "default")
        pre_file = folder / "preprocessor_config.json"
        pre = json.loads(pre_file.read_text()) if pre_file.exists() else {}
        size = pre.get("size", {"shortest_edge": side})
        crop = pre.get("crop_size", {"height": side, "width": side})
        exact = "shortest_edge" not in size  # SiglipImageProcessor: {"height", "width"}
        if exact:
            crop = size
        per_tile = tile_tokens(tower, side, patch, strategy)
        anyres = None
        if cfg["model_type"] == "llava_next":
            pins = cfg.get("image_grid_pinpoints") or pre.get("image_grid_pinpoints") or []
            anyres = AnyresGeometry(
                side,
                per_tile,
                pinpoints=tuple((int(h), int(w)) for h, w in pins),
                side=side // patch,
            )
            check_tiles(anyres)
            if (int(crop["height"]), int(crop["width"])) != (side, side):
                raise ValueError(f"crop_size {crop} is not the vision tower's {side} x {side}")
        return ImageSpec(
            image_token_id=int(cfg.get("image_token_index", cfg.get("image_token_id", 32000))),
            image_token=token_text,
            tokens_per_image=per_tile if anyres is None else anyres.max_tokens(),
            shortest_edge=0 if exact else int(size["shortest_edge"]),
            crop=(int(crop["height"]), int(crop["width"])),
            mean=tuple(pre.get("image_mean", (0.48145466, 0.4578275, 0.40821073))),  # type: ignore[arg-type]
            std=tuple(pre.get("image_std", (0.26862954, 0.26130258, 0.27577711))),  # type: ignore[arg-type]
            rescale=float(pre.get("rescale_factor", 1 / 255)),
            anyres=anyres,
            base=(int(crop["height"]), int(crop["width"]))
            if exact
            else (int(size["shortest_edge"]),) * 2,
        )


@dataclass(frozen=True)
class PreparedImage:
    pixels: np.ndarray  # uint8 [3, H, W]; any-resolution: [tiles, 3, H, W]
    digest: bytes  # content hash of the pixels (and of the size, for any-resolution)
    size: tuple[int, int] = (0, 0)  # the decoded image's (height, width)

    def values(self, spec: ImageSpec) -> np.ndarray:
        """The float32 values the vision tower gets (the model service computes the same)."""
        return normalise(self.pixels, spec.normalize)


def prepare(data: bytes, spec: ImageSpec, bounds: ImageBounds, index: int = 0) -> PreparedImage:
    """Decode, bound and preprocess one image (blocking: call it in a thread)."""
    from PIL import Image

    what = f"image {index}"
    if not data:
        raise InvalidRequest(f"{what} is empty", "images")
    if len(data) > bounds.max_bytes:
        raise InvalidRequest(
            f"{what} has {len(data)} bytes; at most {bounds.max_bytes} are allowed", "images"
        )
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", Image.DecompressionBombWarning)
            img = Image.open(io.BytesIO(data))
            if img.format not in FORMATS:
                raise InvalidRequest(f"{what}: format {img.format} is not one of {FORMATS}")
            w, h = img.size
            if w * h > bounds.max_pixels:
                raise InvalidRequest(
                    f"{what} is {w} x {h} pixels; at most {bounds.max_pixels} pixels are allowed",
                    "images",
                )
            img.load()
            rgb = img.convert("RGB")
    except InvalidRequest:
        raise
    except (Image.DecompressionBombError, Image.DecompressionBombWarning) as exc:
        raise InvalidRequest(
            f"{what} has too many pixels ({exc}); at most {bounds.max_pixels} are allowed",
            "images",
        ) from exc
    except Exception as exc:  # PIL's errors for truncated, corrupt or unknown data
        raise InvalidRequest(f"{what} cannot be decoded: {exc}", "images") from exc
    size = (h, w)
    if spec.anyres is None:
        pixels = _resize_crop(rgb, spec)
        return PreparedImage(pixels, content_hash(pixels.tobytes()), size)
    pixels = anyres_tiles(rgb, spec.anyres, spec.base, lambda t: _resize_crop(t, spec))
    # The size lays out the features too (unpadding): two sizes never share a key.
    key = pixels.tobytes() + np.asarray(size, np.uint32).tobytes()
    return PreparedImage(pixels, content_hash(key), size)


def _resize_crop(img: object, spec: ImageSpec) -> np.ndarray:
    """One image (or tile) to its 8-bit [3, H, W] pixels: resize, crop."""
    from PIL import Image

    assert isinstance(img, Image.Image)
    w, h = img.size
    if spec.shortest_edge:
        short, long_ = (w, h) if w <= h else (h, w)
        new_short, new_long = spec.shortest_edge, int(spec.shortest_edge * long_ / short)
        size = (new_short, new_long) if w <= h else (new_long, new_short)
    else:
        size = (spec.crop[1], spec.crop[0])  # PIL sizes are (width, height)
    img = img.resize(size, Image.Resampling.BICUBIC)
    arr = np.asarray(img, dtype=np.uint8)  # [H, W, 3]
    ch, cw = spec.crop
    hh, ww = arr.shape[:2]
    top, left = max((hh - ch) // 2, 0), max((ww - cw) // 2, 0)
    arr = arr[top : top + ch, left : left + cw]
    return np.ascontiguousarray(arr.transpose(2, 0, 1))


def place(
    ids: list[int], images: list[PreparedImage], spec: ImageSpec, vocab_size: int
) -> tuple[list[int], list[ImageInput]]:
    """Each image marker of `ids` (one `spec.image_token_id`) becomes the next image's
    positions (`tokens_per_image`, or for any-resolution models as many as its size takes)
    holding its pseudo id. Markers and images must pair up."""
    total = sum(im.pixels.nbytes for im in images)
    if total > MAX_REQUEST_PIXEL_BYTES:
        raise InvalidRequest(
            f"the images preprocess to {total} bytes of pixels; at most "
            f"{MAX_REQUEST_PIXEL_BYTES} fit one request: send fewer images",
            "images",
        )
    markers = ids.count(spec.image_token_id)
    if markers != len(images):
        raise InvalidRequest(
            f"the prompt has {markers} image markers ({spec.image_token!r}) for "
            f"{len(images)} images: put one marker where each image goes",
            "images",
        )
    out: list[int] = []
    inputs: list[ImageInput] = []
    it = iter(images)
    for t in ids:
        if t != spec.image_token_id:
            out.append(t)
            continue
        im = next(it)
        pid = pseudo_id(im.digest, vocab_size)
        n = spec.tokens_per_image if spec.anyres is None else spec.anyres.tokens(im.size)
        h, w = im.pixels.shape[-2:]
        c = 3 * im.pixels.shape[0] if im.pixels.ndim == 4 else im.pixels.shape[0]
        size = im.size if spec.anyres is not None else (0, 0)
        raw = im.pixels.tobytes()
        inputs.append(ImageInput(len(out), n, pid, raw, (c, h, w), size, spec.normalize))
        out.extend([pid] * n)
    return out, inputs
