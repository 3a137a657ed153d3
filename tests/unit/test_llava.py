"""The LLaVA path of the model service against HF transformers' LlavaForConditionalGeneration.

A tiny LLaVA (CLIP tower, projector, Llama decoder) with seeded random weights is saved as an
HF checkpoint folder; the model service loads that folder (models/llava.py, weights.py) and
runs it through the runner's steps (images arrive once, in the ADMIT, and the placeholder
positions hold hash-derived pseudo ids). Greedy output must be token-identical to HF's
`generate` on the same weights, for 0, 1 and 2 images, with an image split over two prefill
chunks, and with two requests' images encoded in one batch.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from model_service.attention.reference import ReferenceAttention
from model_service.kv_pool import KVPool
from model_service.models.llava import LlavaForCausalLM
from model_service.runner import ModelRunner
from model_service.weights import load_model
from radixmesh_wire.images import ImageInput, content_hash, pseudo_id
from radixmesh_wire.step_ops import AdmitOp, ExtendOp, Sampling, StepOps
from tests.tiny_vlm import SIDE, tiny_text_config, tiny_vision_config

VOCAB = 300
IMAGE_TOKEN = 299  # HF's placeholder id (inside the vocabulary, as HF requires)
# SIDE: 28 / patch 14 -> 4 patches -> 4 image tokens ("default": CLS dropped)
NEW = 8


def _tiny_config():  # type: ignore[no-untyped-def]
    from transformers import LlavaConfig

    text = tiny_text_config(VOCAB)
    vision = tiny_vision_config("clip")
    return LlavaConfig(vision_config=vision, text_config=text, image_token_index=IMAGE_TOKEN)


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    from transformers import LlavaForConditionalGeneration

    torch.manual_seed(0)
    hf = LlavaForConditionalGeneration(_tiny_config()).eval()
    folder = tmp_path_factory.mktemp("tiny-llava")
    hf.save_pretrained(folder)
    return hf, Path(folder)


def _image(seed: int) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((3, SIDE, SIDE)).astype(np.float32)


def _runner(folder: Path) -> ModelRunner:
    model = load_model(folder, torch.float32, torch.device("cpu"))
    assert isinstance(model, LlavaForCausalLM)
    pool = KVPool(2, 512, 2, 16, torch.float32, torch.device("cpu"))
    return ModelRunner(model, pool, ReferenceAttention(pool, 4, 16), torch.device("cpu"))


def _prompt(images: list[np.ndarray]) -> tuple[list[int], list[int], tuple[ImageInput, ...]]:
    """(HF ids, our ids, our images): text, then each image's 4 placeholders, then text."""
    hf_ids, ids, inputs = [1, 5, 6], [1, 5, 6], []
    for i, px in enumerate(images):
        pid = pseudo_id(content_hash(px.tobytes()), VOCAB)
        inputs.append(ImageInput(len(ids), 4, pid, px.tobytes(), px.shape))  # type: ignore[arg-type]
        hf_ids += [IMAGE_TOKEN] * 4 + [7 + i, 8]
        ids += [pid] * 4 + [7 + i, 8]
    hf_ids += [9, 10]
    ids += [9, 10]
    return hf_ids, ids, tuple(inputs)


def _hf_greedy(hf, hf_ids: list[int], images: list[np.ndarray]) -> list[int]:  # type: ignore[no-untyped-def]
    kw = {}
    if images:
        kw["pixel_values"] = torch.from_numpy(np.stack(images))
    with torch.no_grad():
        out = hf.generate(
            torch.tensor([hf_ids]), max_new_tokens=NEW, do_sample=False, min_new_tokens=NEW, **kw
        )
    return [int(t) for t in out[0, len(hf_ids) :]]


def _ours(
    runner: ModelRunner, reqs: list[tuple[list[int], tuple[ImageInput, ...]]], chunk: int = 0
) -> list[list[int]]:
    """Greedy decode of every request together; with `chunk`, the first request's prompt is
    admitted in two pieces, the first `chunk` tokens then the rest."""
    greedy = Sampling(temperature=0.0)
    ops, slot = StepOps(1), 0
    outs: list[list[int]] = [[] for _ in reqs]
    step = 1
    if chunk:
        ids, imgs = reqs[0]
        ops.admits.append(
            AdmitOp(0, greedy, 0, [], ids[:chunk], list(range(chunk)), False, images=imgs)
        )
        runner.step(ops)
        step += 1
        ops = StepOps(step)
        ops.extends.append(ExtendOp(0, ids[chunk:], list(range(chunk, len(ids))), True))
        slot = len(ids)
    for h, (ids, imgs) in enumerate(reqs):
        if chunk and h == 0:
            continue
        ops.admits.append(
            AdmitOp(h, greedy, 0, [], ids, list(range(slot, slot + len(ids))), True, images=imgs)
        )
        slot += len(ids)
    for _ in range(NEW):
        out = runner.step(ops)
        for r in out.rows:
            outs[r.handle].append(r.token)
        step += 1
        handles = list(range(len(reqs)))
        ops = StepOps(
            step, decode_handles=handles, decode_slots=list(range(slot, slot + len(handles)))
        )
        slot += len(handles)
    return outs


@pytest.mark.parametrize("n_images", [0, 1, 2])
def test_greedy_matches_hf_with_0_1_2_images(checkpoint, n_images: int) -> None:  # type: ignore[no-untyped-def]
    hf, folder = checkpoint
    images = [_image(s) for s in range(n_images)]
    hf_ids, ids, inputs = _prompt(images)
    want = _hf_greedy(hf, hf_ids, images)
    assert _ours(_runner(folder), [(ids, inputs)]) == [want]


def test_an_image_split_over_two_prefill_chunks(checkpoint) -> None:  # type: ignore[no-untyped-def]
    hf, folder = checkpoint
    images = [_image(3), _image(4)]
    hf_ids, ids, inputs = _prompt(images)
    want = _hf_greedy(hf, hf_ids, images)
    assert _ours(_runner(folder), [(ids, inputs)], chunk=5) == [want]  # 2 of 4 image tokens


def test_two_requests_images_in_one_batch(checkpoint) -> None:  # type: ignore[no-untyped-def]
    hf, folder = checkpoint
    a, b = [_image(5)], [_image(6), _image(7)]
    (ha, ia, xa), (hb, ib, xb) = _prompt(a), _prompt(b)
    want = [_hf_greedy(hf, ha, a), _hf_greedy(hf, hb, b)]
    assert _ours(_runner(folder), [(ia, xa), (ib, xb)]) == want


def test_different_images_give_different_output(checkpoint) -> None:  # type: ignore[no-untyped-def]
    """The image really reaches the model: same text, another image, other tokens."""
    _, folder = checkpoint
    outs = [_ours(_runner(folder), [_prompt([_image(s)])[1:]])[0] for s in (10, 11)]
    assert outs[0] != outs[1]


def test_random_llava_shapes() -> None:
    """`--random-weights tiny-llava` / `llava-1.5-7b`: folders the front door reads as LLaVA
    (the tokenizer maps <image> to the config's image id) and a model the runner serves."""
    from transformers import AutoTokenizer

    from model_service.random_configs import random_config
    from model_service.weights import random_llava
    from tokenizer_service.images import ImageSpec

    cfg7, folder7 = random_config("llava-1.5-7b")
    spec7 = ImageSpec.from_folder(folder7)
    assert spec7 is not None and spec7.tokens_per_image == 576 and spec7.crop == (336, 336)
    assert cfg7.text_config.hidden_size == 4096 and cfg7.vision_config.num_hidden_layers == 24
    cfg, folder = random_config("tiny-llava")
    spec = ImageSpec.from_folder(folder)
    assert spec is not None
    tok = AutoTokenizer.from_pretrained(folder)
    assert tok.convert_tokens_to_ids("<image>") == spec.image_token_id == cfg.image_token_index
    model = random_llava(cfg, torch.float32, torch.device("cpu"))
    pool = KVPool(2, 64, 2, 64, torch.float32, torch.device("cpu"))
    runner = ModelRunner(model, pool, ReferenceAttention(pool, 4, 64), torch.device("cpu"))
    px = np.random.default_rng(0).standard_normal((3, 28, 28)).astype(np.float32)
    pid = pseudo_id(content_hash(px.tobytes()), cfg.text_config.vocab_size)
    image = ImageInput(1, 4, pid, px.tobytes(), (3, 28, 28))
    ids = [1, pid, pid, pid, pid, 2]
    ops = StepOps(
        1,
        admits=[
            AdmitOp(0, Sampling(temperature=0.0), 0, [], ids, list(range(6)), True, images=(image,))
        ],
    )
    out = runner.step(ops)
    assert len(out.rows) == 1 and 0 <= out.rows[0].token < cfg.text_config.vocab_size
