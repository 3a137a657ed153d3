"""LLaVA-NeXT (any-resolution images) in the model service against HF transformers'
LlavaNextForConditionalGeneration.

A tiny seeded LLaVA-NeXT (CLIP tower of 28 x 28 pixels in 14-pixel patches: 4 features a
tile; pinpoints of 1 x 2, 2 x 1 and 2 x 2 tiles) is saved as an HF folder and served by the
model service through the runner's steps. The images enter as the front door prepares them
(tokenizer_service/images.py: tiles, base tile, size, placeholder count from the size); HF
gets its own LlavaNextImageProcessorPil's pixels and image sizes. Greedy output must be
token-identical for 0, 1 and 2 images of different aspect ratios (different tile grids and
token counts), also with an image split over two prefill chunks; the same image gives the
same placeholders (its cache key), another size other ones.
"""

from __future__ import annotations

import io
import json
from pathlib import Path

import numpy as np
import pytest
import torch

from model_service.models.llava import LlavaForCausalLM
from model_service.runner import StepError
from model_service.step_validation import StepLimits, validate_step
from radixmesh_wire.images import ImageInput
from radixmesh_wire.step_codec import image_from_proto, image_to_proto
from radixmesh_wire.step_ops import AdmitOp, Sampling, StepOps
from tests.tiny_vlm import tiny_text_config, tiny_vision_config
from tests.unit.test_llava import IMAGE_TOKEN, NEW, SIDE, VOCAB, _ours, _runner
from tokenizer_service.images import ImageBounds, ImageSpec, place, prepare

PINS = [[28, 56], [56, 28], [56, 56]]
# (width, height): wide (1 x 2 tiles, 14 positions), tall (2 x 1, 16), and 2 x 2 tiles whose
# padding rows are dropped (14 positions of the grid's 4 + 4 x 5).
SIZES = [(60, 20), (20, 60), (100, 60)]


def _config():  # type: ignore[no-untyped-def]
    from transformers import LlavaNextConfig

    text = tiny_text_config(VOCAB)
    vision = tiny_vision_config("clip")
    return LlavaNextConfig(
        vision_config=vision,
        text_config=text,
        image_token_index=IMAGE_TOKEN,
        image_grid_pinpoints=PINS,
    )


def _processor():  # type: ignore[no-untyped-def]
    from transformers.models.llava_next.image_processing_pil_llava_next import (
        LlavaNextImageProcessorPil,
    )

    return LlavaNextImageProcessorPil(
        size={"shortest_edge": SIDE},
        crop_size={"height": SIDE, "width": SIDE},
        image_grid_pinpoints=PINS,
    )


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    from transformers import LlavaNextForConditionalGeneration

    torch.manual_seed(2)
    hf = LlavaNextForConditionalGeneration(_config()).eval()
    folder = Path(tmp_path_factory.mktemp("tiny-llava-next"))
    hf.save_pretrained(folder)
    _processor().save_pretrained(folder)
    spec = ImageSpec.from_folder(folder)
    assert spec is not None and spec.anyres is not None
    return hf, folder, spec


def png(w: int, h: int, seed: int) -> bytes:
    from PIL import Image

    arr = np.random.default_rng(seed).integers(0, 256, (h, w, 3), dtype=np.uint8)
    buf = io.BytesIO()
    Image.fromarray(arr).save(buf, format="PNG")
    return buf.getvalue()


def _prompt(
    datas: list[bytes], spec: ImageSpec
) -> tuple[list[int], list[int], tuple[ImageInput, ...]]:
    """(HF ids, our ids, our images): text, each image's placeholders, text."""
    text = [1, 5, 6]
    for i in range(len(datas)):
        text += [IMAGE_TOKEN, 7 + i, 8]
    text += [9, 10]
    prepared = [prepare(d, spec, ImageBounds()) for d in datas]
    ids, inputs = place(text, prepared, spec, VOCAB)
    hf_ids: list[int] = []
    it = iter(inputs)
    for t in text:
        hf_ids += [t] if t != IMAGE_TOKEN else [IMAGE_TOKEN] * next(it).n_tokens
    return hf_ids, ids, tuple(inputs)


def _hf_greedy(hf, hf_ids: list[int], datas: list[bytes]) -> list[int]:  # type: ignore[no-untyped-def]
    from PIL import Image

    kw = {}
    if datas:
        out = _processor()([Image.open(io.BytesIO(d)) for d in datas], return_tensors="pt")
        kw = {"pixel_values": out["pixel_values"], "image_sizes": out["image_sizes"]}
    with torch.no_grad():
        gen = hf.generate(
            torch.tensor([hf_ids]), max_new_tokens=NEW, do_sample=False, min_new_tokens=NEW, **kw
        )
    return [int(t) for t in gen[0, len(hf_ids) :]]


@pytest.mark.parametrize("n_images", [0, 1, 2])
def test_greedy_matches_hf_llava_next(checkpoint, n_images: int) -> None:  # type: ignore[no-untyped-def]
    hf, folder, spec = checkpoint
    datas = [png(w, h, seed=i) for i, (w, h) in enumerate(SIZES[:n_images])]
    hf_ids, ids, inputs = _prompt(datas, spec)
    if n_images == 2:  # two aspect ratios: other tile grids, other token counts
        assert (inputs[0].n_tokens, inputs[1].n_tokens) == (14, 16)
        assert inputs[0].shape[0] == inputs[1].shape[0] == 9  # 1 + 2 tiles, 3 channels each
    runner = _runner(folder)
    assert isinstance(runner.model, LlavaForCausalLM) and runner.model.anyres is not None
    assert _ours(runner, [(ids, inputs)]) == [_hf_greedy(hf, hf_ids, datas)]


def test_two_requests_and_a_split_image(checkpoint) -> None:  # type: ignore[no-untyped-def]
    """A 2 x 2 grid image split over two prefill chunks, batched with another request whose
    images have other grids: all tiles of the step in one tower batch."""
    hf, folder, spec = checkpoint
    a, b = [png(100, 60, 7)], [png(60, 20, 8), png(20, 60, 9)]
    (ha, ia, xa), (hb, ib, xb) = _prompt(a, spec), _prompt(b, spec)
    assert xa[0].shape[0] == 15 and xa[0].n_tokens == 14  # 1 + 4 tiles; padding rows dropped
    want = [_hf_greedy(hf, ha, a), _hf_greedy(hf, hb, b)]
    assert _ours(_runner(folder), [(ia, xa), (ib, xb)], chunk=10) == want


def test_same_image_same_key_other_size_other_key(checkpoint) -> None:  # type: ignore[no-untyped-def]
    _, _, spec = checkpoint
    (_, ids1, in1), (_, ids2, _) = (_prompt([png(60, 20, 3)], spec) for _ in range(2))
    assert ids1 == ids2  # the radix tree sees the same prefix: a cache hit
    _, ids3, in3 = _prompt([png(20, 60, 3)], spec)
    assert ids3[3] != ids1[3] and in3[0].n_tokens != in1[0].n_tokens


def test_folder_spec_matches_model(checkpoint) -> None:  # type: ignore[no-untyped-def]
    """The front door reads the same layout the model service builds from the folder."""
    _, folder, spec = checkpoint
    model = _runner(folder).model
    assert isinstance(model, LlavaForCausalLM)
    assert spec.anyres == model.anyres
    assert spec.tokens_per_image == model.tokens_per_image == 4 + 4 * 5
    assert json.loads((folder / "config.json").read_text())["model_type"] == "llava_next"


def test_the_model_service_checks_each_image_against_its_size(checkpoint) -> None:  # type: ignore[no-untyped-def]
    """Count, size and pixel shape are checked before the step runs: a bad image fails its
    step at validation, never the tower's forward pass. The size crosses the wire."""
    import dataclasses

    _, folder, spec = checkpoint
    model = _runner(folder).model
    assert isinstance(model, LlavaForCausalLM)
    lim = StepLimits(
        VOCAB, 512, 512, 8, image_tokens=model.tokens_per_image, image_geometry=model.anyres
    )
    _, ids, (im,) = _prompt([png(100, 60, 1)], spec)
    assert image_from_proto(image_to_proto(im)) == im and im.image_size == (60, 100)

    def step(image: ImageInput) -> StepOps:
        n = len(ids) - im.n_tokens + image.n_tokens
        want = ids[: im.offset] + [im.pseudo_id] * image.n_tokens + ids[im.offset + im.n_tokens :]
        admit = AdmitOp(0, Sampling(), 0, [], want, list(range(n)), True, images=(image,))
        return StepOps(1, admits=[admit])

    validate_step(step(im), {}, lim)
    bad = [
        (dataclasses.replace(im, image_size=(60, 20)), "images of this size have 16"),
        (dataclasses.replace(im, image_size=(0, 0)), "without its size"),
        (dataclasses.replace(im, n_tokens=24), "images of this size have 14"),
    ]
    tiles = im.pixels[: 9 * SIDE * SIDE]  # 8-bit: 3 tiles' bytes
    bad.append((dataclasses.replace(im, pixels=tiles, shape=(9, SIDE, SIDE)), "pixels of shape"))
    for image, says in bad:
        with pytest.raises(StepError, match=says):
            validate_step(step(image), {}, lim)


def test_random_llava_next_shapes(tmp_path: Path) -> None:
    """`--random-weights llava-next-7b` / `tiny-llava-next`: folders the front door reads as
    LLaVA-NeXT (LLaVA-v1.6-7B's geometry: 2,340 positions for a 640 x 480 image, 2,928 at
    most) and a model the runner serves with an image the front door prepared."""
    from model_service.attention.reference import ReferenceAttention
    from model_service.kv_pool import KVPool
    from model_service.random_configs import random_config
    from model_service.random_llava import llava_config
    from model_service.runner import ModelRunner
    from model_service.weights import random_llava

    cfg7 = llava_config("llava-next-7b")  # its config only: the 7B folder's tokenizer is slow
    cfg7.save_pretrained(tmp_path)
    spec7 = ImageSpec.from_folder(tmp_path)
    assert spec7 is not None and spec7.anyres is not None
    assert spec7.anyres.tokens((480, 640)) == 2340 and spec7.tokens_per_image == 2928
    assert cfg7.model_type == "llava_next" and cfg7.text_config.hidden_size == 4096
    cfg, folder = random_config("tiny-llava-next")
    spec = ImageSpec.from_folder(folder)
    assert spec is not None and spec.anyres is not None
    model = random_llava(cfg, torch.float32, torch.device("cpu"))
    assert model.anyres == spec.anyres
    pool = KVPool(2, 64, 2, 64, torch.float32, torch.device("cpu"))
    runner = ModelRunner(model, pool, ReferenceAttention(pool, 4, 64), torch.device("cpu"))
    vocab = cfg.text_config.vocab_size
    ids, (image,) = place(
        [1, cfg.image_token_index, 2], [prepare(png(60, 20, 0), spec, ImageBounds())], spec, vocab
    )
    greedy = Sampling(temperature=0.0)
    admit = AdmitOp(0, greedy, 0, [], ids, list(range(len(ids))), True, images=(image,))
    out = runner.step(StepOps(1, admits=[admit]))
    assert len(ids) == 2 + 14 and len(out.rows) == 1 and 0 <= out.rows[0].token < vocab


@pytest.mark.parametrize("patch", [14, 7, 4])  # 2, 4 and 7 patches a tile side
def test_layout_equals_hfs_pack_for_many_sizes(patch: int) -> None:
    """`pack_anyres` and `AnyresGeometry.tokens` against HF's own `pack_image_features` for
    sizes from square to 100:1 (tiles of every pinpoint, padding rows or columns dropped,
    or none at all)."""
    from types import SimpleNamespace

    from transformers.models.llava_next.modeling_llava_next import LlavaNextModel

    from model_service.models.llava_next import pack_anyres
    from radixmesh_wire.image_geometry import AnyresGeometry

    side = SIDE // patch
    geom = AnyresGeometry(SIDE, side * side, pinpoints=tuple((h, w) for h, w in PINS), side=side)
    vision = SimpleNamespace(image_size=SIDE, patch_size=patch)
    fake = SimpleNamespace(config=SimpleNamespace(vision_config=vision, image_grid_pinpoints=PINS))
    newline = torch.randn(3)
    rng = np.random.default_rng(patch)
    sizes = [(1, 100), (100, 1), (7, 300), (300, 7), (28, 28), (56, 56), (100, 60), (60, 100)]
    sizes += [(int(h), int(w)) for h, w in rng.integers(1, 400, (40, 2))]
    for h, w in sizes:
        feats = torch.randn(geom.tiles((h, w)), side * side, 3)
        want, lens = LlavaNextModel.pack_image_features(
            fake,  # type: ignore[arg-type]  # only its config is read
            [feats],
            torch.tensor([[h, w]]),
            "default",
            newline,
        )
        got = pack_anyres(feats, (h, w), geom, newline)
        assert got.shape[0] == geom.tokens((h, w)) == int(lens[0]), (h, w)
        assert torch.equal(got, want[0]), (h, w)


def test_a_siglip_llava_next_matches_hf(tmp_path: Path) -> None:
    """The tower follows the config in LLaVA-NeXT too: SigLIP (no CLS, "full": 4 features a
    tile, one per patch), a wide and a tall image, token-identical to HF."""
    from transformers import LlavaNextForConditionalGeneration

    cfg = _config()
    cfg.vision_config = tiny_vision_config("siglip")
    cfg.vision_feature_select_strategy = "full"
    cfg.vision_feature_layer = -1
    torch.manual_seed(3)
    hf = LlavaNextForConditionalGeneration(cfg).eval()
    hf.save_pretrained(tmp_path)
    _processor().save_pretrained(tmp_path)
    spec = ImageSpec.from_folder(tmp_path)
    assert spec is not None and spec.anyres is not None and spec.anyres.tile_tokens == 4
    datas = [png(60, 20, 4), png(20, 60, 5)]
    hf_ids, ids, inputs = _prompt(datas, spec)
    runner = _runner(tmp_path)
    assert type(runner.model.vision_tower).__name__ == "SiglipVisionModel"  # type: ignore[union-attr]
    assert _ours(runner, [(ids, inputs)]) == [_hf_greedy(hf, hf_ids, datas)]
