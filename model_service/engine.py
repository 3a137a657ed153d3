"""Builds the runner from configuration: device, dtype, weights, KV pool size, attention."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import structlog
import torch

from model_service.attention.flashinfer import choose_attention
from model_service.config import ModelServiceConfig
from model_service.kv_pool import KVPool, kv_bytes_per_token
from model_service.models.llama import LlamaForCausalLM
from model_service.runner import ModelRunner
from model_service.weights import load_hf_config, load_model, random_model
from services.model_store import ModelError, resolve_model

log = structlog.get_logger(__name__)

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


@dataclass
class Engine:
    runner: ModelRunner
    model_name: str
    model_dir: Path | None
    context_length: int
    vocab_size: int
    eos_token_ids: list[int]
    device: torch.device
    dtype: torch.dtype
    attention_backend: str
    nan_fill: bool


def pick_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    dev = torch.device(name)
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ModelError(f"--device {name}: CUDA is not available on this machine")
    return dev


def _eos_ids(cfg: object) -> list[int]:
    eos = getattr(cfg, "eos_token_id", None)
    if eos is None:
        return []
    return list(eos) if isinstance(eos, (list, tuple)) else [int(eos)]


def kv_capacity(cfg: ModelServiceConfig, model: LlamaForCausalLM, dtype: torch.dtype,
                device: torch.device) -> int:
    a = model.args
    per_token = kv_bytes_per_token(a.num_layers, a.num_kv_heads, a.head_dim, dtype)
    if cfg.kv_tokens:
        return cfg.kv_tokens
    if device.type == "cuda":
        torch.cuda.empty_cache()  # blocks freed while building the weights count as free
        free, _ = torch.cuda.mem_get_info(device)
        budget = int(free * cfg.kv_memory_fraction)
    else:
        budget = int(cfg.kv_memory_gb * (1 << 30))
    cap = budget // per_token
    if cap < 16:
        raise ModelError(f"KV budget {budget / 2**20:.1f} MiB holds only {cap} tokens "
                         f"({per_token} B each): raise the KV memory budget")
    return cap


def build_engine(cfg: ModelServiceConfig) -> Engine:
    device = pick_device(cfg.device)
    if cfg.dtype == "auto":
        dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    else:
        dtype = _DTYPES[cfg.dtype]
    if cfg.threads and device.type == "cpu":
        torch.set_num_threads(cfg.threads)
    if cfg.random_weights:
        from model_service.random_configs import random_config

        hf_cfg, model_dir = random_config(cfg.random_weights, cfg.tokenizer)
        from model_service.models.llama import LlamaArgs

        model = random_model(LlamaArgs.from_hf_config(hf_cfg), dtype, device)
        name = f"random-{cfg.random_weights}"
    else:
        model_dir = resolve_model(cfg.model)
        hf_cfg = load_hf_config(model_dir)
        model = load_model(model_dir, dtype, device)
        name = getattr(hf_cfg, "_name_or_path", "") or model_dir.name
    capacity = kv_capacity(cfg, model, dtype, device)
    a = model.args
    # One slot more than the scheduler's index space: CUDA-graph padding rows write there.
    pool = KVPool(a.num_layers, capacity + 1, a.num_kv_heads, a.head_dim, dtype, device,
                  nan_fill=cfg.nan_fill)
    pool.capacity = capacity
    attention, note = choose_attention(cfg.attention, pool, a.num_heads, a.num_kv_heads,
                                       a.head_dim)
    if note:
        log.warning("attention_fallback", reason=note)
    if model.ops_note:
        log.warning("fused_kernels_fallback", reason=model.ops_note)
    graphs = None
    if attention.name == "flashinfer":
        from model_service.cuda_graphs import capture_decode_graphs

        graphs = capture_decode_graphs(model, attention, scratch_slot=capacity,
                                       max_kv_tokens=capacity)
    log.info("engine_ready", model=name, device=str(device), dtype=str(dtype),
             kv_tokens=capacity, layers=a.num_layers, attention=attention.name,
             fused=model.fused, kernels=model.ops.name if model.ops else "-",
             cuda_graph_buckets=graphs.buckets if graphs else [])
    return Engine(
        runner=ModelRunner(model, pool, attention, device, decode_graphs=graphs),
        model_name=str(name),
        model_dir=model_dir,
        context_length=a.max_position,
        vocab_size=a.vocab_size,
        eos_token_ids=_eos_ids(hf_cfg),
        device=device,
        dtype=dtype,
        attention_backend=attention.name,
        nan_fill=cfg.nan_fill,
    )
