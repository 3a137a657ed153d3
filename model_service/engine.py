"""Builds the runner from configuration: device, dtype, weights, KV pool size, attention."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import structlog
import torch

from model_service.attention.backend import AttentionBackend
from model_service.attention.flashinfer import FlashInferAttention, choose_attention
from model_service.config import CUDA_HOST_THREADS, ModelServiceConfig
from model_service.cuda_graphs import DecodeCudaGraphs
from model_service.kv_pool import KVPool, kv_bytes_per_token
from model_service.models.llama import LlamaArgs, LlamaForCausalLM
from model_service.models.llava import is_llava, text_config
from model_service.preflight import (
    GIB,
    check_architecture,
    check_kv_before_weights,
    check_kv_fits,
    check_rank_fits,
    check_weights_fit,
    kv_pool_tokens,
    out_of_memory_as_model_error,
)
from model_service.runner import ModelRunner
from model_service.tp.comm import TPComm
from model_service.tp.shard import ONE, Shard, check_divisible, local_args
from model_service.weights import load_hf_config, load_model, random_llava, random_model
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


def kv_capacity(
    cfg: ModelServiceConfig, model: LlamaForCausalLM, dtype: torch.dtype, device: torch.device
) -> int:
    """Token slots of the KV pool: `--kv-tokens` outright (it must fit in free memory), else
    the memory budget over the bytes per token, which must hold one request
    (`preflight.min_kv_tokens`)."""
    a = model.args
    if cfg.kv_tokens:
        per_token = kv_bytes_per_token(a.num_layers, a.num_kv_heads, a.head_dim, dtype)
        check_kv_fits(cfg.kv_tokens, per_token, device)
        return cfg.kv_tokens
    free = 0
    if device.type == "cuda":
        torch.cuda.empty_cache()  # blocks freed while building the weights count as free
        free, _ = torch.cuda.mem_get_info(device)
    return kv_pool_tokens(
        a,
        dtype,
        device,
        cfg.kv_memory_fraction,
        cfg.kv_memory_gb,
        cfg.min_kv_tokens,
        free,
        f"{free / GIB:.2f} GiB free after the weights",
    )


def model_config(cfg: ModelServiceConfig) -> tuple[Any, Path, str]:
    """(HF config, model folder, name) of the model to serve, its architecture checked and,
    with --tp, its split over the ranks (before any large allocation or rank process)."""
    if cfg.random_weights:
        from model_service.random_configs import random_config

        hf_cfg, model_dir = random_config(cfg.random_weights, cfg.tokenizer)
        name = f"random-{cfg.random_weights}"
    else:
        model_dir = resolve_model(cfg.model)
        hf_cfg = load_hf_config(model_dir)
        name = getattr(hf_cfg, "_name_or_path", "") or model_dir.name
    if is_llava(hf_cfg) and cfg.tp > 1:
        raise ModelError(f"{name}: LLaVA models do not support --tp > 1 yet")
    check_architecture(text_config(hf_cfg))  # a LLaVA's language model (its tower: llava.py)
    check_divisible(LlamaArgs.from_hf_config(text_config(hf_cfg)), cfg.tp)
    return hf_cfg, model_dir, str(name)


def build_engine(
    cfg: ModelServiceConfig,
    shard: Shard = ONE,
    comm: TPComm | None = None,
    device: torch.device | None = None,
) -> Engine:
    """One rank's engine (the whole model without tensor parallelism): its shard of the
    weights, a KV pool of its KV heads for the scheduler's whole slot space."""
    device = device or pick_device(cfg.device)
    dtype = _pick_dtype(cfg, device)
    threads = cfg.threads or (CUDA_HOST_THREADS if device.type == "cuda" else 0)
    if threads:  # on CUDA too: torch's default (every core) spins on small host tensors
        torch.set_num_threads(threads)
    hf_cfg, model_dir, name = model_config(cfg)
    full = LlamaArgs.from_hf_config(text_config(hf_cfg))
    args = local_args(full, shard.size)  # this rank's shapes (all of them at --tp 1)
    _check_memory(cfg, args, dtype, device, shard, name)
    model = _build_model(cfg, hf_cfg, full, model_dir, dtype, device, shard, comm)
    pool, capacity = _build_pool(cfg, model, dtype, device, shard, comm)
    a = model.args
    attention, note = choose_attention(cfg.attention, pool, a.num_heads, a.num_kv_heads, a.head_dim)
    if note:
        log.warning("attention_fallback", reason=note)
    if model.ops_note:
        log.warning("fused_kernels_fallback", reason=model.ops_note)
    graphs = None
    if attention.name == "flashinfer":
        graphs = _capture_graphs(cfg, model, attention, device, capacity)
    log.info(
        "engine_ready",
        model=name,
        tp_rank=shard.rank,
        tp=shard.size,
        device=str(device),
        dtype=str(dtype),
        kv_tokens=capacity,
        host_kv_tokens=cfg.host_kv_tokens,
        layers=a.num_layers,
        attention=attention.name,
        fused=model.fused,
        kernels=model.ops.name if model.ops else "-",
        cuda_graph_buckets=graphs.buckets if graphs else [],
    )
    return Engine(
        runner=ModelRunner(model, pool, attention, device, decode_graphs=graphs),
        model_name=str(name),
        model_dir=model_dir,
        context_length=cfg.context_length or a.max_position,
        vocab_size=model.vocab_size,
        eos_token_ids=_eos_ids(hf_cfg) or _eos_ids(text_config(hf_cfg)),
        device=device,
        dtype=dtype,
        attention_backend=attention.name,
        nan_fill=cfg.nan_fill,
    )


def _pick_dtype(cfg: ModelServiceConfig, device: torch.device) -> torch.dtype:
    if cfg.dtype == "auto":
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    return _DTYPES[cfg.dtype]


def _check_memory(
    cfg: ModelServiceConfig,
    args: LlamaArgs,
    dtype: torch.dtype,
    device: torch.device,
    shard: Shard,
    name: str,
) -> None:
    """The start-up checks that refuse a model that cannot fit, before any large allocation."""
    random = bool(cfg.random_weights)
    check_rank_fits(args, dtype, device, shard, cfg.min_kv_tokens, random)
    check_weights_fit(args, dtype, device, str(name), random=random)
    check_kv_before_weights(
        args,
        dtype,
        device,
        kv_tokens=cfg.kv_tokens,
        kv_memory_fraction=cfg.kv_memory_fraction,
        kv_memory_gb=cfg.kv_memory_gb,
        min_tokens=cfg.min_kv_tokens,
    )


def _build_model(
    cfg: ModelServiceConfig,
    hf_cfg: Any,
    full: LlamaArgs,
    model_dir: Path,
    dtype: torch.dtype,
    device: torch.device,
    shard: Shard,
    comm: TPComm | None,
) -> LlamaForCausalLM:
    """This rank's weights: random (a LLaVA's whole model, or a text model's shard) or loaded."""
    with out_of_memory_as_model_error(
        "building the weights",
        device,
        "they were estimated to fit, so something else took the memory: free the device or "
        "use a smaller model or dtype",
    ):
        if cfg.random_weights and is_llava(hf_cfg):
            model: LlamaForCausalLM = random_llava(hf_cfg, dtype, device)
        elif cfg.random_weights:
            model = random_model(full, dtype, device, shard=shard, comm=comm)
        else:
            model = load_model(model_dir, dtype, device, shard=shard, comm=comm)
    return model


def _build_pool(
    cfg: ModelServiceConfig,
    model: LlamaForCausalLM,
    dtype: torch.dtype,
    device: torch.device,
    shard: Shard,
    comm: TPComm | None,
) -> tuple[KVPool, int]:
    """The KV pool (and its host tier) and the slot count the scheduler is told."""
    capacity = kv_capacity(cfg, model, dtype, device)
    if comm is not None:
        # Every rank holds the same slot indices: the pool is as large as the smallest rank's
        # memory allows (ranks on GPUs with other tenants may have less free).
        own, capacity = capacity, comm.agree_min(capacity)
        if capacity < own:
            log.info("kv_tokens_agreed", own=own, kv_tokens=capacity, tp_rank=shard.rank)
    a = model.args
    with out_of_memory_as_model_error(
        f"allocating the KV pool ({capacity} tokens)",
        device,
        "lower --kv-memory-fraction or --kv-tokens",
    ):
        # One slot more than the scheduler's index space: CUDA-graph padding rows write there.
        pool = KVPool(
            a.num_layers,
            capacity + 1,
            a.num_kv_heads,
            a.head_dim,
            dtype,
            device,
            nan_fill=cfg.nan_fill,
        )
    pool.capacity = capacity
    if cfg.host_kv_tokens:
        with out_of_memory_as_model_error(
            f"allocating the host KV pool ({cfg.host_kv_tokens} tokens)",
            torch.device("cpu"),
            "lower --host-kv-tokens",
        ):
            pool.add_host_tier(cfg.host_kv_tokens)
    return pool, capacity


def _capture_graphs(
    cfg: ModelServiceConfig,
    model: LlamaForCausalLM,
    attention: AttentionBackend,
    device: torch.device,
    capacity: int,
) -> DecodeCudaGraphs | None:
    """Decode CUDA graphs (flashinfer attention only; None where none are captured), their
    padding rows writing to the spare slot."""
    from model_service.cuda_graphs import capture_decode_graphs

    with out_of_memory_as_model_error(
        "capturing decode CUDA graphs",
        device,
        "lower --kv-memory-fraction to leave them room, or capture fewer batch sizes "
        f"(--cuda-graph-max-bs, now {cfg.cuda_graph_max_bs}; 0 turns graphs off)",
    ):
        return capture_decode_graphs(
            model,
            cast(FlashInferAttention, attention),  # the one backend of that name
            scratch_slot=capacity,
            max_kv_tokens=capacity,
            max_bs=cfg.cuda_graph_max_bs,
        )
