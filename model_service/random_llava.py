"""LLaVA shapes for `--random-weights` (docs/multimodal.md): GPU benchmarks of the image path
build the model on the device, like the text shapes of random_configs.py.

Names:
- `llava-1.5-7b`: LLaVA-1.5-7B's architecture (llava-hf/llava-1.5-7b-hf's config.json): a CLIP
  ViT-L/14 at 336 pixels (576 image tokens, features of the second-to-last layer, CLS dropped),
  a two-layer GELU projector, Llama-2-7B's decoder shapes (4096 wide, 32 layers, 32 heads, no
  GQA, 4096 context). The vocabulary is the bundled Llama-3.1 tokenizer's plus `<image>`
  (id 128256), padded to 128264 (the original uses Vicuna's 32,064: only the embedding and
  output tables differ).
- `tiny-llava`: the same layout in miniature (28-pixel images, 4 image tokens), for tests.
- `llava-next-7b`: LLaVA-NeXT (llava-hf/llava-v1.6-vicuna-7b-hf's layout): the same tower,
  projector and decoder, any-resolution images on its grid pinpoints (336 x 672, 672 x 336,
  672 x 672, 1008 x 336, 336 x 1008: up to 5 tiles, up to 2,928 positions an image).
- `tiny-llava-next`: `tiny-llava` with pinpoints of 1 x 2, 2 x 1 and 2 x 2 tiles of 28.

The folder holds config.json (a LlavaConfig or LlavaNextConfig), the tokenizer with `<image>`
added and the image processor's preprocessor_config.json (CLIPImageProcessor or
LlavaNextImageProcessor), so the front door reads it like a real LLaVA.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

IMAGE_TOKEN = "<image>"
VOCAB = 128264  # the Llama-3.1 tokenizer (128256) + <image>, padded

_TEXT_7B: dict[str, Any] = {
    "vocab_size": VOCAB,
    "hidden_size": 4096,
    "intermediate_size": 11008,
    "num_hidden_layers": 32,
    "num_attention_heads": 32,
    "num_key_value_heads": 32,
    "max_position_embeddings": 4096,
    "rms_norm_eps": 1e-5,
    "rope_theta": 10000.0,
    "tie_word_embeddings": False,
    "bos_token_id": 128000,
    "eos_token_id": [128001, 128008, 128009],
}
_VISION_L336: dict[str, Any] = {
    "hidden_size": 1024,
    "intermediate_size": 4096,
    "num_hidden_layers": 24,
    "num_attention_heads": 16,
    "image_size": 336,
    "patch_size": 14,
    "projection_dim": 768,
    "hidden_act": "quick_gelu",
}
_TINY: tuple[dict[str, Any], dict[str, Any]] = (
    {
        **_TEXT_7B,
        "hidden_size": 256,
        "intermediate_size": 512,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
    },
    {
        **_VISION_L336,
        "hidden_size": 32,
        "intermediate_size": 64,
        "num_hidden_layers": 2,
        "num_attention_heads": 2,
        "image_size": 28,
        "projection_dim": 32,
    },
)
SHAPES: dict[str, tuple[dict[str, Any], dict[str, Any]]] = {
    "llava-1.5-7b": (_TEXT_7B, _VISION_L336),
    "tiny-llava": _TINY,
    "llava-next-7b": (_TEXT_7B, _VISION_L336),
    "tiny-llava-next": _TINY,
}
# LLaVA-NeXT shapes: their grid pinpoints, (height, width) in pixels.
PINPOINTS: dict[str, list[list[int]]] = {
    "llava-next-7b": [[336, 672], [672, 336], [672, 672], [1008, 336], [336, 1008]],
    "tiny-llava-next": [[28, 56], [56, 28], [56, 56]],
}


def llava_config(name: str) -> Any:
    from transformers import CLIPVisionConfig, LlamaConfig, LlavaConfig, LlavaNextConfig

    text, vision = SHAPES[name]
    common: dict[str, Any] = {
        "vision_config": CLIPVisionConfig(**vision),
        "text_config": LlamaConfig(**text),
        "image_token_index": VOCAB - 8,  # the id the tokenizer gives <image>
        "vision_feature_layer": -2,
        "vision_feature_select_strategy": "default",
        "projector_hidden_act": "gelu",
    }
    if name in PINPOINTS:
        nxt = LlavaNextConfig(**common, image_grid_pinpoints=PINPOINTS[name])
        nxt.architectures = ["LlavaNextForConditionalGeneration"]
        return nxt
    cfg = LlavaConfig(**common)
    cfg.architectures = ["LlavaForConditionalGeneration"]
    return cfg


def random_llava_config(name: str, model_dir: Path, tokenizer_dir: Path) -> Any:
    """(LlavaConfig or LlavaNextConfig, folder) for `--random-weights NAME` (of SHAPES)."""
    from transformers import AutoTokenizer, CLIPImageProcessor, LlavaNextImageProcessor

    cfg = llava_config(name)
    cfg._name_or_path = f"random-{name}"
    model_dir.mkdir(parents=True, exist_ok=True)
    if not (model_dir / "tokenizer.json").exists():
        tok = AutoTokenizer.from_pretrained(tokenizer_dir)
        tok.add_special_tokens({"additional_special_tokens": [IMAGE_TOKEN]})
        got = tok.convert_tokens_to_ids(IMAGE_TOKEN)
        if got != cfg.image_token_index:
            raise ValueError(f"{IMAGE_TOKEN} got id {got}, expected {cfg.image_token_index}")
        tok.save_pretrained(model_dir)
    side = cfg.vision_config.image_size
    size, crop = {"shortest_edge": side}, {"height": side, "width": side}
    if name in PINPOINTS:
        proc = LlavaNextImageProcessor(
            size=size, crop_size=crop, image_grid_pinpoints=PINPOINTS[name]
        )
        proc.save_pretrained(model_dir)
    else:
        CLIPImageProcessor(size=size, crop_size=crop).save_pretrained(model_dir)
    cfg_json = cfg.to_dict()
    cfg_json["_name_or_path"] = f"random-{name}"
    (model_dir / "config.json").write_text(
        json.dumps(cfg_json, indent=2, sort_keys=True, default=str)
    )
    return cfg
