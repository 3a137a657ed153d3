"""Start-up checks of the model service: fail before allocating, with a message that says what
to do (issue 4: weights that do not fit, a KV budget too small for one request, an architecture
the model code does not support, out-of-memory during start-up).

Every failure is a `ModelError`; `python -m model_service` turns it into exit code 2 and one
`startup_failed` log line. Pure functions over the HF config / `LlamaArgs` plus one probe of
free memory (`free_memory`), so each check is unit-testable with a monkeypatched probe.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from typing import Any

import torch

from model_service.kv_pool import kv_bytes_per_token
from model_service.models.llama import LlamaArgs
from model_service.tp.shard import Shard
from services.model_store import ModelError

GIB = float(1 << 30)
# What the model code implements (models/llama.py): Llama-family decoders with SiLU MLPs,
# RoPE (default or Llama 3.1 scaling), no MLP bias, full attention.
SUPPORTED_MODEL_TYPES = ("llama", "qwen2")
SUPPORTED_ARCHITECTURES = ("LlamaForCausalLM", "Qwen2ForCausalLM")
SUPPORTED_ROPE = (None, "default", "llama3")
DEFAULT_MIN_KV_CAP = 4096  # --min-kv-tokens 0: min(context length, this)


def _supported() -> str:
    return (
        f"model_type {'/'.join(SUPPORTED_MODEL_TYPES)} "
        f"({', '.join(SUPPORTED_ARCHITECTURES)}: SiLU MLP without bias, RoPE default or "
        f"llama3, full attention)"
    )


def check_architecture(hf_cfg: Any) -> None:
    """ModelError unless `hf_cfg` is a decoder that models/llama.py computes exactly."""
    mtype = getattr(hf_cfg, "model_type", "")
    archs = list(getattr(hf_cfg, "architectures", None) or [])
    problems: list[str] = []
    if mtype not in SUPPORTED_MODEL_TYPES:
        problems.append(f"model_type {mtype!r}")
    bad = [a for a in archs if a not in SUPPORTED_ARCHITECTURES]
    if bad:
        problems.append(f"architectures {bad}")
    act = getattr(hf_cfg, "hidden_act", "silu")
    if act != "silu":
        problems.append(f"hidden_act {act!r}")
    if getattr(hf_cfg, "mlp_bias", False):
        problems.append("mlp_bias true")
    if getattr(hf_cfg, "use_sliding_window", False):
        problems.append("sliding-window attention")
    rope = getattr(hf_cfg, "rope_scaling", None) or getattr(hf_cfg, "rope_parameters", None)
    rope_type = (rope or {}).get("rope_type", (rope or {}).get("type"))
    if rope_type not in SUPPORTED_ROPE:
        problems.append(f"rope type {rope_type!r}")
    heads = getattr(hf_cfg, "num_attention_heads", 0)
    kv_heads = getattr(hf_cfg, "num_key_value_heads", None) or heads
    if heads and kv_heads and heads % kv_heads:
        problems.append(f"{heads} attention heads not a multiple of {kv_heads} KV heads")
    if problems:
        raise ModelError(
            f"unsupported model architecture: {'; '.join(problems)}. Supported: {_supported()}"
        )


def param_count(a: LlamaArgs) -> int:
    """Parameters of LlamaForCausalLM(a), from the config alone (tied lm_head counted once)."""
    h, q, kv = a.hidden_size, a.num_heads * a.head_dim, a.num_kv_heads * a.head_dim
    attn = h * q + 2 * h * kv + q * h + ((q + 2 * kv) if a.attention_bias else 0)
    layer = attn + 3 * h * a.intermediate_size + 2 * h
    head = 0 if a.tie_word_embeddings else a.vocab_size * h
    return a.num_layers * layer + a.vocab_size * h + head + h


def weight_load_bytes(a: LlamaArgs, dtype: torch.dtype, device: torch.device, random: bool) -> int:
    """Peak bytes on `device` while building the weights: random weights are created in fp32
    and then cast (weights.random_model), and fusing on CUDA holds one layer's gate and up
    projections twice for a moment (models/llama.py `_concat_linear`)."""
    elem = torch.empty(0, dtype=dtype).element_size()
    n = param_count(a)
    peak = n * max(elem, 4) if random else n * elem
    if device.type == "cuda":
        peak += 2 * a.hidden_size * a.intermediate_size * elem
    return peak


def _mem_available_cpu() -> int | None:
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def free_memory(device: torch.device) -> tuple[int, int] | None:
    """(free, total) bytes on `device` (CUDA: the driver's view; CPU: MemAvailable and
    MemTotal), or None where it cannot be read."""
    if device.type == "cuda":
        return tuple(torch.cuda.mem_get_info(device))  # type: ignore[return-value]
    avail = _mem_available_cpu()
    if avail is None:
        return None
    try:
        total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError):
        total = avail
    return avail, total


def _free_text(device: torch.device) -> str:
    mem = free_memory(device)
    if mem is None:
        return "free memory unknown"
    return f"{mem[0] / GIB:.2f} GiB free of {mem[1] / GIB:.2f} GiB on {device}"


def check_weights_fit(
    a: LlamaArgs, dtype: torch.dtype, device: torch.device, name: str, random: bool
) -> None:
    """ModelError when building the weights would need more memory than `device` has free."""
    need = weight_load_bytes(a, dtype, device, random)
    mem = free_memory(device)
    if mem is None or need <= mem[0]:
        return
    how = "built in float32, then cast" if random and dtype != torch.float32 else str(dtype)
    raise ModelError(
        f"the weights of {name} do not fit: {param_count(a) / 1e9:.2f} B parameters need "
        f"{need / GIB:.2f} GiB on {device} ({how}), but only {mem[0] / GIB:.2f} GiB of "
        f"{mem[1] / GIB:.2f} GiB is free. Free the device (other processes), use one with "
        f"more memory, a 16-bit --dtype, or for benchmarks fewer layers "
        f"(--random-weights NAME:num_hidden_layers=N)"
    )


def check_rank_fits(
    a: LlamaArgs,
    dtype: torch.dtype,
    device: torch.device,
    shard: Shard,
    min_tokens: int,
    random: bool,
) -> None:
    """Tensor parallelism: ModelError when one rank's weights (`a`: its shapes,
    `tp.shard.local_args`) plus the smallest worthwhile KV pool of its KV heads do not fit the
    free memory of its device. The message names every figure, so the operator can pick a
    larger --tp or other GPUs."""
    if shard.size == 1:
        return
    mem = free_memory(device)
    if mem is None:
        return
    weights = weight_load_bytes(a, dtype, device, random)
    tokens = min_kv_tokens(min_tokens, a.max_position)
    kv = tokens * kv_bytes_per_token(a.num_layers, a.num_kv_heads, a.head_dim, dtype)
    if weights + kv <= mem[0]:
        return
    raise ModelError(
        f"--tp {shard.size} does not fit: rank {shard.rank} on {device} needs "
        f"{weights / GIB:.2f} GiB for its {param_count(a) / 1e9:.2f} B parameters "
        f"({dtype}{', built in float32' if random and dtype != torch.float32 else ''}) plus "
        f"{kv / GIB:.2f} GiB for {tokens} KV tokens of its {a.num_kv_heads} KV heads = "
        f"{(weights + kv) / GIB:.2f} GiB, but only {mem[0] / GIB:.2f} GiB of "
        f"{mem[1] / GIB:.2f} GiB is free there. Use a larger --tp (more GPUs per replica), "
        f"GPUs with more free memory, or a 16-bit --dtype"
    )


def min_kv_tokens(requested: int, context_length: int) -> int:
    """The smallest KV pool worth serving: `--min-kv-tokens`, or min(context, 4096)."""
    return requested if requested > 0 else min(context_length, DEFAULT_MIN_KV_CAP)


def check_kv_capacity(
    capacity: int, needed: int, budget: int, per_token: int, budget_from: str
) -> None:
    """ModelError when a pool sized from the memory budget cannot hold one request."""
    if capacity >= needed:
        return
    raise ModelError(
        f"KV budget too small for one request: {budget / 2**20:.1f} MiB ({budget_from}) holds "
        f"{capacity} tokens at {per_token} B each, fewer than the {needed} tokens of one "
        f"request (--min-kv-tokens; default min(context length, {DEFAULT_MIN_KV_CAP})). Raise "
        f"--kv-memory-fraction (GPU) or --kv-memory-gb (CPU), free device memory, use a "
        f"smaller model or dtype, or set --kv-tokens to size the pool outright"
    )


def kv_pool_tokens(
    a: LlamaArgs,
    dtype: torch.dtype,
    device: torch.device,
    kv_memory_fraction: float,
    kv_memory_gb: float,
    min_tokens: int,
    free_bytes: int,
    free_note: str,
) -> int:
    """Token slots the memory budget holds: on CUDA `kv_memory_fraction` of `free_bytes`
    (described in messages as `free_note`), on CPU `--kv-memory-gb`. ModelError when that is
    fewer than one request needs (`min_kv_tokens`)."""
    per_token = kv_bytes_per_token(a.num_layers, a.num_kv_heads, a.head_dim, dtype)
    if device.type == "cuda":
        budget = int(free_bytes * kv_memory_fraction)
        source = f"--kv-memory-fraction {kv_memory_fraction} of {free_note}"
    else:
        budget = int(kv_memory_gb * (1 << 30))
        source = f"--kv-memory-gb {kv_memory_gb}"
    cap = budget // per_token
    check_kv_capacity(cap, min_kv_tokens(min_tokens, a.max_position), budget, per_token, source)
    return cap


def check_kv_before_weights(
    a: LlamaArgs,
    dtype: torch.dtype,
    device: torch.device,
    kv_tokens: int,
    kv_memory_fraction: float,
    kv_memory_gb: float,
    min_tokens: int,
) -> None:
    """The KV budget check of `engine.kv_capacity`, made before the weights are built, so a
    budget too small for one request fails in seconds instead of after loading the weights.

    On CPU the budget (`--kv-memory-gb`) does not depend on the weights: same figures as the
    later check. On CUDA the budget is `kv_memory_fraction` of the memory free after the
    weights, which is at most (free now - the weights' bytes in `dtype`); when even that bound
    holds fewer tokens than one request needs, the later check would fail too, so fail now.
    Otherwise the later check, on the real free memory, decides. `--kv-tokens` skips it."""
    if kv_tokens:
        return
    after, note = 0, ""
    if device.type == "cuda":
        mem = free_memory(device)
        if mem is None:
            return
        weights = param_count(a) * torch.empty(0, dtype=dtype).element_size()
        after = max(mem[0] - weights, 0)
        note = (
            f"at most {after / GIB:.2f} GiB free after {weights / GIB:.2f} GiB of weights; "
            f"{mem[0] / GIB:.2f} GiB of {mem[1] / GIB:.2f} GiB free before loading"
        )
    kv_pool_tokens(a, dtype, device, kv_memory_fraction, kv_memory_gb, min_tokens, after, note)


def check_kv_fits(tokens: int, per_token: int, device: torch.device) -> None:
    """ModelError when an explicit --kv-tokens pool is larger than the free memory."""
    mem = free_memory(device) if device.type == "cuda" else None
    need = tokens * per_token
    if mem is None or need <= mem[0]:
        return
    raise ModelError(
        f"--kv-tokens {tokens} needs {need / GIB:.2f} GiB ({per_token} B per token) but only "
        f"{mem[0] / GIB:.2f} GiB of {mem[1] / GIB:.2f} GiB is free on {device} after the "
        f"weights: lower --kv-tokens, or set it to 0 to size the pool from "
        f"--kv-memory-fraction"
    )


@contextlib.contextmanager
def out_of_memory_as_model_error(what: str, device: torch.device, hint: str) -> Iterator[None]:
    """Turn an allocation failure during start-up into a ModelError naming the stage, the
    memory left and what to do (instead of a traceback)."""
    try:
        yield
        return
    except (torch.OutOfMemoryError, MemoryError) as exc:
        oom: BaseException = exc
    except RuntimeError as exc:  # the CPU allocator raises a plain RuntimeError
        if "can't allocate memory" not in str(exc):
            raise
        oom = exc
    if device.type == "cuda":
        torch.cuda.empty_cache()
    first = str(oom).strip().splitlines()[0] if str(oom).strip() else type(oom).__name__
    raise ModelError(
        f"out of memory while {what} ({_free_text(device)}): {hint} [{first[:200]}]"
    ) from oom
