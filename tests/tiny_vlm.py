"""The tiny seeded vision-language configs every LLaVA test builds on (unit and integration):
a 2-layer Llama text model and a 2-layer vision tower of one 28-pixel tile (2 x 2 patches of
14). Small enough that HF's reference and ours run in seconds on a CPU."""

from __future__ import annotations

from typing import Any

SIDE = 28  # the tower's tile: 28 / patch 14 -> 2 x 2 patches


def tiny_text_config(vocab: int, max_positions: int = 512, **extra: Any) -> Any:
    """A 2-layer Llama. `initializer_range` 0.2: peaked logits, so greedy ties cannot flip on
    rounding between HF and us."""
    from transformers import LlamaConfig

    return LlamaConfig(
        vocab_size=vocab,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=max_positions,
        initializer_range=0.2,
        **{"eos_token_id": None, **extra},
    )


def tiny_vision_config(tower: str = "clip") -> Any:
    """A 2-layer CLIP or SigLIP vision tower of one SIDE-pixel tile."""
    from transformers import CLIPVisionConfig, SiglipVisionConfig

    cls = {"clip": CLIPVisionConfig, "siglip": SiglipVisionConfig}[tower]
    return cls(
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=2,
        image_size=SIDE,
        patch_size=14,
    )
