"""Build a model from an HF folder (safetensors, HF parameter names) or from random weights."""

from __future__ import annotations

from pathlib import Path

import structlog
import torch
from safetensors import safe_open

from model_service.models.llama import LlamaArgs, LlamaForCausalLM, rope_inv_freq

log = structlog.get_logger(__name__)


class WeightsError(Exception):
    pass


def load_hf_config(folder: Path):  # type: ignore[no-untyped-def]
    from transformers import AutoConfig

    return AutoConfig.from_pretrained(folder)


def load_model(folder: Path, dtype: torch.dtype, device: torch.device) -> LlamaForCausalLM:
    args = LlamaArgs.from_hf_config(load_hf_config(folder))
    with torch.device("meta"):
        model = LlamaForCausalLM(args)
    files = sorted(folder.glob("*.safetensors"))
    if not files:
        raise WeightsError(f"no *.safetensors files in {folder}")
    state: dict[str, torch.Tensor] = {}
    for f in files:
        with safe_open(str(f), framework="pt", device="cpu") as st:
            for name in st.keys():  # noqa: SIM118 (safe_open is not a dict)
                state[name] = st.get_tensor(name).to(dtype)
    if args.tie_word_embeddings:
        state.pop("lm_head.weight", None)
    expected = {k for k in model.state_dict() if not (
        args.tie_word_embeddings and k == "lm_head.weight")}
    missing = expected - state.keys()
    if missing:
        raise WeightsError(f"checkpoint lacks {len(missing)} tensors, e.g. {sorted(missing)[:3]}")
    model.load_state_dict(state, strict=False, assign=True)
    if args.tie_word_embeddings:
        model.lm_head.weight = model.model.embed_tokens.weight
    model.inv_freq = rope_inv_freq(args)  # non-persistent buffer: still on meta after loading
    return model.to(device).eval()


def random_model(args: LlamaArgs, dtype: torch.dtype, device: torch.device,
                 seed: int = 0) -> LlamaForCausalLM:
    """Seeded normal(0, 0.02) weights, norms 1 (DESIGN.md section 3): same speed as trained."""
    torch.manual_seed(seed)
    with torch.device(device):
        model = LlamaForCausalLM(args).to(dtype)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.fill_(1.0)
            else:
                p.normal_(0.0, 0.02)
    return model.eval()
