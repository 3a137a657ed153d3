"""Build a model from an HF folder (safetensors, HF parameter names) or from random weights.

Checkpoints load under their HF names into the separate-projection form; on CUDA the model is
then fused (`LlamaForCausalLM.fuse()`: q|k|v and gate|up concatenated once, at load time), so
the fast path needs no renamed checkpoint. `RADIXMESH_FUSE=0` keeps the separate form on CUDA
too (for comparisons); the CPU path is never fused.
"""

from __future__ import annotations

import os
from pathlib import Path

import structlog
import torch
from safetensors import safe_open

from model_service.models.llama import LlamaArgs, LlamaForCausalLM, Reducer, rope_inv_freq
from model_service.models.llava import LlavaForCausalLM, is_llava, llava_key, vision_key_for
from model_service.tp.shard import ONE, Shard, local_args, take
from services.model_store import ModelError

log = structlog.get_logger(__name__)


class WeightsError(ModelError):
    """A checkpoint that cannot be loaded (start-up reports it like any ModelError)."""


ENV_FUSE = "RADIXMESH_FUSE"


def want_fused(device: torch.device, fuse: bool | None = None) -> bool:
    """Fuse on CUDA unless $RADIXMESH_FUSE is 0; an explicit `fuse` wins."""
    if fuse is not None:
        return fuse
    return device.type == "cuda" and os.environ.get(ENV_FUSE, "1").strip() != "0"


def load_hf_config(folder: Path):  # type: ignore[no-untyped-def]
    from transformers import AutoConfig

    return AutoConfig.from_pretrained(folder)


def _meta_model(args: LlamaArgs, shard: Shard, comm: Reducer | None) -> LlamaForCausalLM:
    """One rank's model, shapes only (local_args), to be filled by a loader."""
    with torch.device("meta"):
        return LlamaForCausalLM(local_args(args, shard.size), comm, args.vocab_size)


def load_model(
    folder: Path,
    dtype: torch.dtype,
    device: torch.device,
    fuse: bool | None = None,
    shard: Shard = ONE,
    comm: Reducer | None = None,
) -> LlamaForCausalLM:
    """An HF checkpoint; with tensor parallelism only this rank's part of each tensor is kept
    (read one tensor at a time)."""
    hf_cfg = load_hf_config(folder)
    files = sorted(folder.glob("*.safetensors"))
    if not files:
        raise WeightsError(f"no *.safetensors files in {folder}")
    if is_llava(hf_cfg):
        return load_llava(hf_cfg, files, dtype, device, comm)
    args = LlamaArgs.from_hf_config(hf_cfg)
    model = _meta_model(args, shard, comm)
    state: dict[str, torch.Tensor] = {}
    for f in files:
        with safe_open(str(f), framework="pt", device="cpu") as st:
            for name in st.keys():  # noqa: SIM118 (safe_open is not a dict)
                part = take(name, st.get_tensor(name), args, shard)
                state[name] = part.to(dtype=dtype, copy=shard.size > 1)
    if args.tie_word_embeddings:
        state.pop("lm_head.weight", None)
    expected = {
        k for k in model.state_dict() if not (args.tie_word_embeddings and k == "lm_head.weight")
    }
    missing = expected - state.keys()
    if missing:
        raise WeightsError(f"checkpoint lacks {len(missing)} tensors, e.g. {sorted(missing)[:3]}")
    model.load_state_dict(state, strict=False, assign=True)
    if args.tie_word_embeddings:
        model.lm_head.weight = model.model.embed_tokens.weight
    model.inv_freq = rope_inv_freq(args)  # non-persistent buffer: still on meta after loading
    model = model.to(device).eval()
    if want_fused(device, fuse):
        model.fuse()
    return model


def random_model(
    args: LlamaArgs,
    dtype: torch.dtype,
    device: torch.device,
    seed: int = 0,
    fuse: bool | None = None,
    shard: Shard = ONE,
    comm: Reducer | None = None,
) -> LlamaForCausalLM:
    """Seeded normal(0, 0.02) weights, norms 1 (docs/architecture.md): same speed as trained.
    Weights are drawn in the separate form (HF parameter order), then fused where wanted, so
    a fused and an unfused model of the same seed hold the same weights. Each tensor is drawn
    whole, in float32 on `device`, and this rank keeps its part (`tp.shard.take`) cast to
    `dtype`: every tensor-parallel degree holds the same model, and a rank never holds more
    than its shard plus one whole tensor. RoPE frequencies stay fp32 (`LlamaForCausalLM._apply`)."""
    full = _meta_model(args, Shard(), None)  # names, order and whole shapes
    model = _meta_model(args, shard, comm).to_empty(device=device).to(dtype)
    own = dict(model.named_parameters())
    torch.manual_seed(seed)
    with torch.no_grad():
        for name, p in full.named_parameters():
            if name.endswith("norm.weight"):
                own[name].fill_(1.0)
                continue
            whole = torch.empty(p.shape, device=device).normal_(0.0, 0.02)  # fp32, as before
            own[name].copy_(take(name, whole, args, shard))
            del whole
    if args.tie_word_embeddings:
        model.lm_head.weight = model.model.embed_tokens.weight
    model.inv_freq = rope_inv_freq(args).to(device)  # to_empty left the buffer uninitialised
    if want_fused(device, fuse):
        model.fuse()
    return model.eval()


def load_llava(
    hf_cfg: object,
    files: list[Path],
    dtype: torch.dtype,
    device: torch.device,
    comm: Reducer | None = None,
) -> LlavaForCausalLM:
    """An HF LLaVA checkpoint (either layout, `models.llava.llava_key`); never fused (the
    vision path runs the separate form on every device for now)."""
    with torch.device("meta"):
        model = LlavaForCausalLM(hf_cfg, comm)
    state: dict[str, torch.Tensor] = {}
    for f in files:
        with safe_open(str(f), framework="pt", device="cpu") as st:
            for name in st.keys():  # noqa: SIM118 (safe_open is not a dict)
                key = vision_key_for(model, llava_key(name))
                state[key] = st.get_tensor(name).to(dtype=dtype)
    tied = model.args.tie_word_embeddings
    if tied:
        state.pop("lm_head.weight", None)
    expected = {k for k in model.state_dict() if not (tied and k == "lm_head.weight")}
    missing = expected - state.keys()
    if missing:
        raise WeightsError(f"checkpoint lacks {len(missing)} tensors, e.g. {sorted(missing)[:3]}")
    model.load_state_dict(state, strict=False, assign=True)
    if tied:
        model.lm_head.weight = model.model.embed_tokens.weight
    model.inv_freq = rope_inv_freq(model.args)
    _tower_buffers(model, torch.device("cpu"))
    return model.to(device).eval()


def _tower_buffers(model: LlavaForCausalLM, device: torch.device) -> None:
    """The CLIP tower's non-persistent position ids, left on meta (or uninitialised) by
    building on meta: rebuilt as CLIP builds them."""
    for mod in model.vision_tower.modules():
        for bname, buf in list(mod.named_buffers(recurse=False)):
            if bname == "position_ids":
                ids = torch.arange(buf.shape[-1], device=device).expand(buf.shape)
                mod.register_buffer(bname, ids, persistent=False)


def random_llava(
    hf_cfg: object, dtype: torch.dtype, device: torch.device, seed: int = 0
) -> LlavaForCausalLM:
    """A LLaVA with seeded random weights (`--random-weights llava-...`): normal(0, 0.02),
    norms weight 1 and bias 0, other biases 0; the separate (unfused) form."""
    with torch.device("meta"):
        model = LlavaForCausalLM(hf_cfg)
    model = model.to_empty(device=device).to(dtype)
    torch.manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.fill_(1.0 if name.endswith("weight") else 0.0)
            elif name.endswith("bias"):
                p.zero_()
            else:
                p.normal_(0.0, 0.02)
    model.inv_freq = rope_inv_freq(model.args).to(device)
    _tower_buffers(model, device)
    return model.eval()
