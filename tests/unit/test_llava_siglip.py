"""A LLaVA with a SigLIP vision tower against HF transformers' LlavaForConditionalGeneration.

The tower follows the config (`vision_config.model_type`): a tiny seeded LLaVA whose
vision_config is a SiglipVisionConfig is saved as an HF folder, the model service loads it and
runs it through the runner's steps; greedy output must be token-identical to HF's `generate`
for 0, 1 and 2 images, under the "full" select strategy (SigLIP has no CLS: all 4 patches)
and the "default" one (HF drops the first feature whatever the tower: 3). An unsupported
tower is refused by name, by the model and by the front door's spec.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from model_service.models.llava import LlavaForCausalLM
from radixmesh_wire.images import ImageInput, content_hash, pseudo_id
from tests.tiny_vlm import tiny_text_config, tiny_vision_config
from tests.unit.test_llava import IMAGE_TOKEN, NEW, SIDE, VOCAB, _hf_greedy, _ours, _runner
from tokenizer_service.images import ImageSpec


def _config(strategy: str, layer: int):  # type: ignore[no-untyped-def]
    from transformers import LlavaConfig

    text = tiny_text_config(VOCAB)
    vision = tiny_vision_config("siglip")
    return LlavaConfig(
        vision_config=vision,
        text_config=text,
        image_token_index=IMAGE_TOKEN,
        vision_feature_select_strategy=strategy,  # type: ignore[arg-type]
        vision_feature_layer=layer,
    )


def _checkpoint(tmp: Path, strategy: str, layer: int):  # type: ignore[no-untyped-def]
    from transformers import LlavaForConditionalGeneration

    torch.manual_seed(1)
    hf = LlavaForConditionalGeneration(_config(strategy, layer)).eval()
    hf.save_pretrained(tmp)
    return hf


@pytest.fixture(scope="module")
def full(tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    folder = Path(tmp_path_factory.mktemp("siglip-full"))
    return _checkpoint(folder, "full", -1), folder


def _image(seed: int) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((3, SIDE, SIDE)).astype(np.float32)


def _prompt(
    images: list[np.ndarray], per_image: int
) -> tuple[list[int], list[int], tuple[ImageInput, ...]]:
    hf_ids, ids, inputs = [1, 5, 6], [1, 5, 6], []
    for i, px in enumerate(images):
        pid = pseudo_id(content_hash(px.tobytes()), VOCAB)
        inputs.append(ImageInput(len(ids), per_image, pid, px.tobytes(), px.shape))  # type: ignore[arg-type]
        hf_ids += [IMAGE_TOKEN] * per_image + [7 + i, 8]
        ids += [pid] * per_image + [7 + i, 8]
    return hf_ids + [9, 10], ids + [9, 10], tuple(inputs)


@pytest.mark.parametrize("n_images", [0, 1, 2])
def test_siglip_greedy_matches_hf(full, n_images: int) -> None:  # type: ignore[no-untyped-def]
    hf, folder = full
    runner = _runner(folder)
    model = runner.model
    assert isinstance(model, LlavaForCausalLM)
    assert type(model.vision_tower).__name__ == "SiglipVisionModel"
    assert model.tokens_per_image == 4  # (28 / 14)^2 patches, no CLS, "full" keeps them all
    images = [_image(20 + s) for s in range(n_images)]
    hf_ids, ids, inputs = _prompt(images, 4)
    want = _hf_greedy(hf, hf_ids, images)
    assert len(want) == NEW
    assert _ours(runner, [(ids, inputs)]) == [want]


def test_siglip_default_strategy_drops_the_first_patch(tmp_path: Path) -> None:
    hf = _checkpoint(tmp_path, "default", -2)
    runner = _runner(tmp_path)
    assert runner.model.tokens_per_image == 3  # type: ignore[attr-defined]
    images = [_image(30)]
    hf_ids, ids, inputs = _prompt(images, 3)
    assert _ours(runner, [(ids, inputs)]) == [_hf_greedy(hf, hf_ids, images)]
    spec = ImageSpec.from_folder(tmp_path)
    assert spec is not None and spec.tokens_per_image == 3


def test_an_unsupported_tower_is_refused_by_name(full, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    from transformers import LlavaConfig

    _, folder = full
    cfg = json.loads((folder / "config.json").read_text())
    cfg["vision_config"]["model_type"] = "pixtral"
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ValueError, match="vision tower 'pixtral' is not supported"):
        ImageSpec.from_folder(tmp_path)
    hf_cfg = LlavaConfig.from_pretrained(folder)
    hf_cfg.vision_config.model_type = "pixtral"  # type: ignore[union-attr,misc]
    with pytest.raises(ValueError, match="vision tower 'pixtral' is not supported"):
        LlavaForCausalLM(hf_cfg)


def test_front_door_spec_of_a_siglip_llava(full) -> None:  # type: ignore[no-untyped-def]
    """SiglipImageProcessor's config (a fixed {height, width}, no crop) gives an exact resize
    and the tower's token count."""
    from transformers import SiglipImageProcessor

    _, folder = full
    SiglipImageProcessor(size={"height": SIDE, "width": SIDE}).save_pretrained(folder)
    spec = ImageSpec.from_folder(folder)
    assert spec is not None
    assert (spec.tokens_per_image, spec.shortest_edge, spec.crop) == (4, 0, (SIDE, SIDE))
    assert spec.mean == (0.5, 0.5, 0.5) and spec.image_token_id == IMAGE_TOKEN


def test_tile_tokens_of_real_towers() -> None:
    """SigLIP-so400m-patch14-384's 384 pixels are 27 whole patches a side (the convolution's
    stride drops the rest): 729 features; CLIP ViT-L/14-336 under "default": 576."""
    from radixmesh_wire.image_geometry import tile_tokens

    assert tile_tokens("siglip_vision_model", 384, 14, "full") == 729
    assert tile_tokens("clip_vision_model", 336, 14, "default") == 576
    assert tile_tokens("clip_vision_model", 336, 14, "full") == 577
