"""Tiny LLaVA checkpoint folders for stack tests: HF transformers' own
LlavaForConditionalGeneration with seeded random weights (CLIP tower 28 x 28 pixels in 14-pixel
patches: 4 image tokens), the default model's tokenizer and chat template with an added
"<image>" token, and a CLIPImageProcessor config; and the same as a LLaVA-NeXT
(LlavaNextForConditionalGeneration, pinpoints of 1 x 2, 2 x 1 and 2 x 2 tiles, a
LlavaNextImageProcessor config). Built once per path."""

from __future__ import annotations

import io
import shutil
from pathlib import Path

import numpy as np

from tests.tiny_vlm import SIDE, tiny_text_config, tiny_vision_config

PINPOINTS = [[28, 56], [56, 28], [56, 56]]


def build_tiny_llava(dest: Path, text_model: Path, seed: int = 0, next_: bool = False) -> Path:
    """`next_`: a LLaVA-NeXT (any-resolution images) instead of a LLaVA-1.5."""
    import torch
    from transformers import (
        AutoTokenizer,
        CLIPImageProcessor,
        LlavaConfig,
        LlavaForConditionalGeneration,
        LlavaNextConfig,
        LlavaNextForConditionalGeneration,
        LlavaNextImageProcessor,
    )

    if (dest / "model.safetensors").exists():
        return dest
    dest.mkdir(parents=True, exist_ok=True)
    tok = AutoTokenizer.from_pretrained(text_model)
    tok.add_special_tokens({"additional_special_tokens": ["<image>"]})
    image_id = int(tok.convert_tokens_to_ids("<image>"))  # type: ignore[arg-type]
    tok.save_pretrained(dest)
    for extra in ("chat_template.jinja",):
        if (text_model / extra).exists() and not (dest / extra).exists():
            shutil.copy(text_model / extra, dest / extra)
    text = tiny_text_config(
        len(tok), 2048, eos_token_id=tok.eos_token_id, bos_token_id=tok.bos_token_id
    )
    vision = tiny_vision_config("clip")
    torch.manual_seed(seed)
    size, crop = {"shortest_edge": SIDE}, {"height": SIDE, "width": SIDE}
    if next_:
        nxt = LlavaNextConfig(
            vision_config=vision,
            text_config=text,
            image_token_index=image_id,
            image_grid_pinpoints=PINPOINTS,
        )
        LlavaNextForConditionalGeneration(nxt).save_pretrained(dest)
        proc = LlavaNextImageProcessor(size=size, crop_size=crop, image_grid_pinpoints=PINPOINTS)
        proc.save_pretrained(dest)
        return dest
    cfg = LlavaConfig(vision_config=vision, text_config=text, image_token_index=image_id)
    LlavaForConditionalGeneration(cfg).save_pretrained(dest)
    CLIPImageProcessor(size=size, crop_size=crop).save_pretrained(dest)
    return dest


def png(seed: int, w: int = 40, h: int = 32) -> bytes:
    from PIL import Image

    arr = np.random.default_rng(seed).integers(0, 256, (h, w, 3), dtype=np.uint8)
    buf = io.BytesIO()
    Image.fromarray(arr).save(buf, format="PNG")
    return buf.getvalue()
