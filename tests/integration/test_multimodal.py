"""Images end to end on the CPU stack (issue 32), with a tiny LLaVA (tests/integration/
tiny_llava.py: HF's own LlavaForConditionalGeneration with seeded random weights).

- greedy output through the gRPC API equals HF transformers' `generate` on the same folder
  (its processor's pixels, its placeholder expansion) for prompts with 0, 1 and 2 images;
- the radix tree keys images by content: the same image after the same text is a cache hit
  that covers the image, another image with the same text is not;
- bad images (truncated PNG, 20k x 20k pixels, not an image) and a marker/image mismatch are
  INVALID_ARGUMENT, and a good request after them is served.
"""

from __future__ import annotations

import base64
import io
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
import requests
import torch
from radixmesh.api import Client, RadixMeshError

from tests.conftest import Stack, start_stack
from tests.integration.tiny_llava import build_tiny_llava, png

pytestmark = pytest.mark.integration

IMAGE_TOKENS = 4  # 28 x 28 pixels in 14-pixel patches
NEW = 8


@pytest.fixture(scope="module")
def llava_dir(tmp_path_factory: pytest.TempPathFactory, model_dir: Path) -> Path:
    return build_tiny_llava(tmp_path_factory.mktemp("tiny-llava") / "m", model_dir)


@pytest.fixture(scope="module")
def mm_stack(tmp_path_factory: pytest.TempPathFactory, llava_dir: Path) -> Iterator[Stack]:
    yield from start_stack(
        tmp_path_factory.mktemp("mm_stack"),
        model_args=["--model", str(llava_dir), "--kv-tokens", "2048"],
        scheduler_args=["--radix", "tree", "--debug-invariants"],
        tokenizer_args=["--model", str(llava_dir)],
    )


def _hf_greedy(folder: Path, text: str, images: list[bytes]) -> list[int]:
    from PIL import Image
    from transformers import AutoTokenizer, CLIPImageProcessor, LlavaForConditionalGeneration

    tok = AutoTokenizer.from_pretrained(folder)
    hf = LlavaForConditionalGeneration.from_pretrained(folder).eval()
    image_id = hf.config.image_token_index
    ids: list[int] = []
    for t in tok.encode(text):
        ids += [t] * (IMAGE_TOKENS if t == image_id else 1)
    kw = {}
    if images:
        proc = CLIPImageProcessor.from_pretrained(folder)
        pics: list[Image.Image] = [Image.open(io.BytesIO(b)) for b in images]
        kw["pixel_values"] = proc(pics, return_tensors="pt")["pixel_values"]
    with torch.no_grad():
        out = hf.generate(
            torch.tensor([ids]), max_new_tokens=NEW, min_new_tokens=NEW, do_sample=False, **kw
        )
    return [int(t) for t in out[0, len(ids) :]]


PROMPTS = {
    0: "A picture of a cat. What is in it?",
    1: "<image>\nWhat is in this picture?",
    2: "First <image> then <image>: what changed?",
}


@pytest.mark.parametrize("n_images", [0, 1, 2])
def test_greedy_matches_hf(mm_stack: Stack, llava_dir: Path, n_images: int) -> None:
    images = [png(40 + i) for i in range(n_images)]
    text = PROMPTS[n_images]
    with Client(mm_stack.endpoint) as c:
        got = c.generate(
            text, images=images, max_new_tokens=NEW, min_new_tokens=NEW, temperature=0.0
        )
    assert got.output_ids == _hf_greedy(llava_dir, text, images)


def test_same_image_hits_the_cache_and_another_image_does_not(mm_stack: Stack) -> None:
    text = "Here is a photo: <image> Describe it in one word."
    a, b = png(101), png(102)
    with Client(mm_stack.endpoint) as c:
        first, again, other = (
            c.generate(text, images=[im], max_new_tokens=2, temperature=0.0) for im in (a, a, b)
        )
    with Client(mm_stack.endpoint) as c:  # the prompt's tokens before the image
        head = len(c.tokenize("Here is a photo: ", add_special_tokens=True))
    assert first.cached_tokens <= head  # nothing of this image was cached before
    assert again.cached_tokens >= head + IMAGE_TOKENS  # the image's KV is reused
    assert other.cached_tokens == head  # the text before it only: never the image
    assert again.prompt_tokens == first.prompt_tokens == other.prompt_tokens


def _huge_png() -> bytes:
    from PIL import Image

    buf = io.BytesIO()
    Image.new("1", (20000, 20000)).save(buf, format="PNG")
    return buf.getvalue()


@pytest.mark.parametrize(
    ("name", "text", "images", "says"),
    [
        ("truncated", "<image> hi", [png(7)[:200]], "cannot be decoded"),
        ("huge", "<image> hi", [_huge_png()], "pixels"),
        ("not an image", "<image> hi", [b"%PDF-1.4 hello"], "cannot be decoded"),
        ("no marker", "hi", [png(8)], "image markers"),
    ],
)
def test_bad_images_are_invalid_argument_and_harm_no_one(
    mm_stack: Stack, name: str, text: str, images: list[bytes], says: str
) -> None:
    with Client(mm_stack.endpoint) as c:
        with pytest.raises(RadixMeshError) as err:
            c.generate(text, images=images, max_new_tokens=2)
        assert err.value.code == grpc.StatusCode.INVALID_ARGUMENT, name
        assert says in str(err.value), name
        ok = c.generate("<image> fine", images=[png(9)], max_new_tokens=2, temperature=0.0)
    assert ok.completion_tokens == 2


def _data_url(b: bytes) -> str:
    return "data:image/png;base64," + base64.b64encode(b).decode()


def test_openai_chat_image_url_parts(mm_stack: Stack) -> None:
    """An image_url part (a data URL) is the image at that place of the message: the same
    output as the gRPC chat with the marker there and the image attached."""
    img = png(201)
    body: dict[str, Any] = {
        "model": "m",
        "messages": [
            {
                "role": "user",
                "content": [
                    {"type": "text", "text": "What is this? "},
                    {"type": "image_url", "image_url": {"url": _data_url(img)}},
                ],
            }
        ],
        "max_tokens": NEW,
        "temperature": 0,
    }
    r = requests.post(mm_stack.http_url + "/v1/chat/completions", json=body, timeout=120)
    assert r.status_code == 200, r.text
    msgs = [{"role": "user", "content": "What is this? <image>"}]
    with Client(mm_stack.endpoint) as c:
        want = c.generate(
            messages=msgs,
            images=[img],
            max_new_tokens=NEW,
            temperature=0.0,
            skip_special_tokens=True,
        )
    assert r.json()["choices"][0]["message"]["content"] == want.text
    assert r.json()["usage"]["prompt_tokens"] == want.prompt_tokens
    remote = {
        **body,
        "messages": [
            {
                "role": "user",
                "content": [
                    {"type": "image_url", "image_url": {"url": "http://169.254.169.254/x.png"}}
                ],
            }
        ],
    }
    r = requests.post(mm_stack.http_url + "/v1/chat/completions", json=remote, timeout=60)
    assert r.status_code == 400 and "remote image URLs are not fetched" in r.text


def test_sglang_generate_image_data(mm_stack: Stack) -> None:
    img = png(202)
    text = "<image>\nDescribe the picture."
    payload: dict[str, Any] = {
        "text": text,
        "image_data": base64.b64encode(img).decode(),
        "sampling_params": {"temperature": 0, "max_new_tokens": NEW},
    }
    r = requests.post(mm_stack.http_url + "/generate", json=payload, timeout=120)
    assert r.status_code == 200, r.text
    with Client(mm_stack.endpoint) as c:
        want = c.generate(
            text, images=[img], max_new_tokens=NEW, temperature=0.0, skip_special_tokens=True
        )
    assert r.json()["text"] == want.text
    bad: dict[str, Any] = {**payload, "image_data": "/etc/passwd"}
    r = requests.post(mm_stack.http_url + "/generate", json=bad, timeout=60)
    assert r.status_code == 400, r.text


def test_paper_multimodal_program_with_a_fork(mm_stack: Stack) -> None:
    """The paper's multimodal program: an image, a question, then a fork of two follow-ups.
    The answer equals the same prompt sent directly; each follow-up reuses the cached prefix
    through the image and the answer (its cached_tokens cover them)."""
    import radixmesh.lang as rm

    img = png(301)

    @rm.function
    def image_qa(s: rm.ProgramState, image: bytes, question: str) -> None:
        s += "USER: " + rm.image(image) + " " + question + "\nASSISTANT:"
        s += rm.gen("answer", max_tokens=NEW, temperature=0)
        forks = s.fork(2)
        for i, follow_up in enumerate(["Why?", "What colour is it?"]):
            forks[i] += f"\nUSER: {follow_up}\nASSISTANT:"
            forks[i] += rm.gen("more", max_tokens=NEW, temperature=0)
        forks.join("gather_variable")

    backend = rm.RuntimeEndpoint(mm_stack.endpoint)
    try:
        state = image_qa.run(image=img, question="What is in the image?", backend=backend)
        more = state["more"]
        answer = state["answer"]
        head = len(backend.tokenize("USER: ", add_special_tokens=True))
    finally:
        backend.close()
    with Client(mm_stack.endpoint) as c:
        direct = c.generate(
            "USER: <image> What is in the image?\nASSISTANT:",
            images=[img],
            max_new_tokens=NEW,
            temperature=0.0,
        )
    assert answer == direct.text
    assert len(more) == 2 and all(isinstance(m, str) for m in more)
    assert direct.cached_tokens >= head + IMAGE_TOKENS  # the program's run cached the image
