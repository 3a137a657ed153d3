"""The front door's image path without a stack (tokenizer_service/core.py, images.py):
a text-only model refuses images naming the model; a LLaVA folder's images are decoded in the
tokenizer pool (not on the event loop) and their markers become hash-keyed positions, in text
and in chat content (where other special-token text stays plain)."""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path

import grpc
import pytest

from services.model_store import resolve_model
from tests.integration.tiny_llava import build_tiny_llava, png
from tokenizer_service import images as images_mod
from tokenizer_service.config import TokenizerConfig
from tokenizer_service.core import FrontDoor, GenerateError, GenerateInput
from tokenizer_service.routing.replica_set import ReplicaSet
from tokenizer_service.tokenization import Tokenization


def _door(folder: Path) -> FrontDoor:
    cfg = TokenizerConfig(scheduler_address="x:1")
    return FrontDoor(cfg, Tokenization(folder), ReplicaSet.from_config(cfg))


@pytest.fixture(scope="module")
def llava_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_llava(tmp_path_factory.mktemp("llava") / "m", resolve_model("default"))


def test_a_text_only_model_refuses_images_naming_the_model() -> None:
    door = _door(resolve_model("default"))
    inp = GenerateInput(text="hello", images=[png(1)])
    with pytest.raises(GenerateError) as err:
        asyncio.run(door.prepare(inp))
    assert err.value.status == grpc.StatusCode.INVALID_ARGUMENT
    assert "text-only" in err.value.message and door.tok.model_name in err.value.message


def test_images_are_decoded_off_the_loop_and_placed(
    llava_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    door = _door(llava_dir)
    spec = door.image_spec
    assert spec is not None and spec.tokens_per_image == 4
    threads: list[str] = []
    real = images_mod.prepare

    def spy(*a: object) -> images_mod.PreparedImage:
        threads.append(threading.current_thread().name)
        return real(*a)  # type: ignore[arg-type]

    monkeypatch.setattr("tokenizer_service.core.prepare", spy)
    inp = GenerateInput(text="a <image> b <image>", images=[png(1), png(2)])
    ids, _ = asyncio.run(door.prepare(inp))
    assert len(threads) == 2 and all(t.startswith("tokenize") for t in threads)
    offsets = [im.offset for im in inp.image_inputs]
    for im in inp.image_inputs:
        assert ids[im.offset : im.offset + 4] == [im.pseudo_id] * 4
    assert inp.image_inputs[0].pseudo_id != inp.image_inputs[1].pseudo_id
    assert offsets[1] > offsets[0] + 4 and spec.image_token_id not in ids


def test_chat_content_keeps_the_image_marker(llava_dir: Path) -> None:
    door = _door(llava_dir)
    msgs = [{"role": "user", "content": "look <image> and <|im_start|> stays text"}]
    inp = GenerateInput(messages=msgs, images=[png(3)])
    ids, _ = asyncio.run(door.prepare(inp))
    (im,) = inp.image_inputs
    assert ids[im.offset : im.offset + 4] == [im.pseudo_id] * 4
    im_start = int(door.tok.tok.convert_tokens_to_ids("<|im_start|>"))  # type: ignore[arg-type]
    plain = door.tok.apply_chat([{"role": "user", "content": "look"}], True)
    assert ids.count(im_start) == plain.count(im_start)  # the template's own markers only
    assert "<|im_start|> stays text" in door.tok.decode(ids)
