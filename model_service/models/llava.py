"""LLaVA-style vision-language model: a CLIP vision tower, a projector and our Llama decoder.

Layout and numerics as HF transformers' `LlavaForConditionalGeneration` (LLaVA-1.5):
- the vision tower is transformers' own class for `vision_config.model_type` (`CLIPVisionModel`
  or `SiglipVisionModel`: real dependencies, used as is); another tower is refused by name;
- image features are the tower's hidden states at `vision_feature_layer` (an index, or a list
  whose layers are concatenated), less the first feature under the "default" select strategy
  (CLIP's CLS; HF drops the first feature whatever the tower);
- the projector is linear_1 -> activation -> linear_2 (ours, HF parameter names);
- the language model is `LlamaForCausalLM` (ours): the image's features replace the token
  embeddings at the image's placeholder positions, and from there on an image token is a token
  like any other (its KV is written to the pool and cached by the radix tree).

LLaVA-NeXT (`model_type: llava_next`, HF's `LlavaNextForConditionalGeneration`) is the same
model plus any-resolution images: an image arrives as a base tile plus a grid of tiles (the
front door cut them, as LlavaNextImageProcessor does), all tiles go through the tower in one
batch, and each image's features are laid out by its size (`llava_next.pack_anyres`), with
the learned `image_newline` feature after every row; so its token count depends on its size
(`radixmesh_wire.image_geometry.AnyresGeometry`).

Placeholder ids: at an image's positions the sequence holds a pseudo id >= vocab_size derived
from the image's content hash (`radixmesh_wire.images.pseudo_id`), so the radix tree tells
images apart; they are never looked up in the embedding table (they are masked to 0 first and
their rows overwritten by the image's features). An id >= vocab_size whose row receives no
feature is a scheduler bug, refused by the runner before the forward pass.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from model_service.attention.backend import LayerAttention
from model_service.image_rows import image_pixels
from model_service.models.llama import LlamaArgs, LlamaForCausalLM, Reducer
from model_service.models.llava_next import pack_anyres
from radixmesh_wire.image_geometry import TOWER_HAS_CLS, AnyresGeometry, ImageGeometry, tile_tokens
from radixmesh_wire.images import ImageInput

LLAVA_MODEL_TYPES = ("llava", "llava_next")


def is_llava(hf_cfg: Any) -> bool:
    return getattr(hf_cfg, "model_type", "") in LLAVA_MODEL_TYPES


def text_config(hf_cfg: Any) -> Any:
    """The language model's config: a LLaVA config's `text_config`, else the config itself."""
    return hf_cfg.text_config if is_llava(hf_cfg) else hf_cfg


# transformers' class for each tower of image_geometry.TOWER_HAS_CLS (the same keys).
_TOWER_CLASSES = {
    "clip_vision_model": "CLIPVisionModel",
    "siglip_vision_model": "SiglipVisionModel",
}
assert _TOWER_CLASSES.keys() == TOWER_HAS_CLS.keys()


def build_tower(vcfg: Any) -> nn.Module:
    """transformers' own vision model for this vision config; ValueError for another tower."""
    import transformers

    kind = getattr(vcfg, "model_type", "")
    if kind not in _TOWER_CLASSES:
        raise ValueError(
            f"vision tower {kind!r} is not supported (supported: {', '.join(_TOWER_CLASSES)})"
        )
    return getattr(transformers, _TOWER_CLASSES[kind])(vcfg)  # type: ignore[no-any-return]


_ACTS = {"gelu": nn.GELU, "gelu_pytorch_tanh": lambda: nn.GELU(approximate="tanh")}


class Projector(nn.Module):
    """HF's LlavaMultiModalProjector: vision width (x layers) -> text width, two linears."""

    def __init__(self, in_dim: int, out_dim: int, act: str, bias: bool) -> None:
        super().__init__()
        if act not in _ACTS:
            raise ValueError(f"projector activation {act!r} is not supported ({sorted(_ACTS)})")
        self.linear_1 = nn.Linear(in_dim, out_dim, bias=bias)
        self.act = _ACTS[act]()
        self.linear_2 = nn.Linear(out_dim, out_dim, bias=bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear_2(self.act(self.linear_1(x)))


class LlavaForCausalLM(LlamaForCausalLM):
    """`LlamaForCausalLM` plus `vision_tower` and `multi_modal_projector`. Text-only steps run
    exactly the parent's code; a step with image rows passes them to `forward(images=...)`."""

    def __init__(self, hf_cfg: Any, comm: Reducer | None = None) -> None:
        if comm is not None:
            raise ValueError("LLaVA models do not support tensor parallelism yet")
        super().__init__(LlamaArgs.from_hf_config(hf_cfg.text_config))
        vcfg = hf_cfg.vision_config
        self.vision_tower = build_tower(vcfg)
        layer = hf_cfg.vision_feature_layer
        self.feature_layers: tuple[int, ...] = (
            tuple(layer) if isinstance(layer, (list, tuple)) else (int(layer),)
        )
        self.select_strategy: str = hf_cfg.vision_feature_select_strategy
        per_tile = tile_tokens(
            vcfg.model_type, int(vcfg.image_size), int(vcfg.patch_size), self.select_strategy
        )
        self.multi_modal_projector = Projector(
            vcfg.hidden_size * len(self.feature_layers),
            self.args.hidden_size,
            hf_cfg.projector_hidden_act,
            bool(getattr(hf_cfg, "multimodal_projector_bias", True)),
        )
        self.image_size: int = int(vcfg.image_size)
        self.geometry = ImageGeometry(self.image_size, per_tile)
        self.anyres: AnyresGeometry | None = None
        if hf_cfg.model_type == "llava_next":
            self.anyres = AnyresGeometry(
                self.image_size,
                per_tile,
                pinpoints=tuple((int(h), int(w)) for h, w in hf_cfg.image_grid_pinpoints),
                side=self.image_size // int(vcfg.patch_size),
            )
            self.geometry = self.anyres
            self.image_newline = nn.Parameter(torch.empty(self.args.hidden_size))
        self.tokens_per_image: int = self.geometry.max_tokens()  # LLaVA-NeXT: the most

    def image_features(self, pixels: torch.Tensor) -> torch.Tensor:
        """pixels [tiles, 3, H, W] (preprocessed) -> features [tiles, tile_tokens, hidden]."""
        dtype = self.lm_head.weight.dtype
        out = self.vision_tower(pixels.to(dtype), output_hidden_states=True)
        hs = torch.cat([out.hidden_states[i] for i in self.feature_layers], dim=-1)
        if self.select_strategy == "default":
            hs = hs[:, 1:]
        return self.multi_modal_projector(hs)

    def encode_images(self, images: list[ImageInput], device: torch.device) -> list[torch.Tensor]:
        """Each image's features [its tokens, hidden]; every tile of every image goes through
        the tower as one batch. The images were checked against `geometry` (step_validation)."""
        tiles = [image_pixels(im, device) for im in images]
        feats = self.image_features(torch.cat(tiles))
        out: list[torch.Tensor] = []
        at = 0
        for im, t in zip(images, tiles, strict=True):
            f = feats[at : at + t.shape[0]]
            at += t.shape[0]
            out.append(f[0] if self.anyres is None else self._pack(f, im))
        return out

    def _pack(self, feats: torch.Tensor, im: ImageInput) -> torch.Tensor:
        assert self.anyres is not None
        return pack_anyres(feats, im.image_size, self.anyres, self.image_newline)

    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        attn: LayerAttention,
        logit_rows: torch.Tensor,
        embeds: torch.Tensor | None = None,
        images: tuple[torch.Tensor, torch.Tensor] | None = None,
    ) -> torch.Tensor:
        """`images`: (rows [K] of this step's tokens, their features [K, hidden])."""
        if images is None:
            return super().forward(input_ids, positions, attn, logit_rows, embeds)
        rows, feats = images
        vocab = self.args.vocab_size
        x = self.embed(input_ids.masked_fill(input_ids >= vocab, 0))
        x = x.index_copy(0, rows, feats.to(x.dtype))
        return super().forward(input_ids, positions, attn, logit_rows, embeds=x)


def llava_key(name: str) -> str:
    """An HF LLaVA checkpoint's tensor name -> ours. Both layouts:
    llava-hf's (`language_model.model.*`, `language_model.lm_head.*`, `vision_tower.*`,
    `multi_modal_projector.*`) and transformers v5's (`model.language_model.*`, `lm_head.*`,
    `model.vision_tower.*`, `model.multi_modal_projector.*`); the CLIP tower's tensors with or
    without its `vision_model.` level."""
    for old, new in (
        ("language_model.model.", "model."),
        ("language_model.lm_head.", "lm_head."),
        ("model.language_model.", "model."),
        ("model.vision_tower.", "vision_tower."),
        ("model.multi_modal_projector.", "multi_modal_projector."),
        ("model.image_newline", "image_newline"),
    ):
        if name.startswith(old):
            name = new + name[len(old) :]
            break
    if name.startswith("vision_tower.vision_model."):
        name = "vision_tower." + name[len("vision_tower.vision_model.") :]
    return name


def vision_key_for(model: LlavaForCausalLM, name: str) -> str:
    """Our flat `vision_tower.X` name -> the tower module's own name (with or without the
    `vision_model.` level, whichever this transformers version uses)."""
    if not name.startswith("vision_tower."):
        return name
    own = model.vision_tower.state_dict()
    rest = name[len("vision_tower.") :]
    if rest not in own and f"vision_model.{rest}" in own:
        return f"vision_tower.vision_model.{rest}"
    return name
