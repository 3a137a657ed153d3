"""Model service configuration (CLI flags and RADIXMESH_* environment variables)."""

from __future__ import annotations

from dataclasses import dataclass

from services.config import field
from services.service_config import ServiceConfig

# torch intra-op threads of a CUDA model service when --threads is 0. Its host work per step is
# a few small tensors; torch's default pool (every core) kept 9-18 cores spinning per process
# and made replicas or TP ranks on one host compete (docs/gpu.md, fourth session). Measured on
# an H200 with SGLang's client, ShareGPT 2,000: 4 threads 7,474 output tok/s against 6,871
# with every core (fifth session, call 1, one GPU, same lane).
CUDA_HOST_THREADS = 4


@dataclass
class ModelServiceConfig(ServiceConfig):
    """RadixMesh model service: weights, KV pool, attention, sampling."""

    host: str = field("127.0.0.1", "address to listen on")
    port: int = field(50053, "port to listen on")
    model: str = field("default", "HF-format Llama/Qwen2 folder, or 'default' (SmolLM2-135M)")
    random_weights: str = field("", "build this architecture with random weights (llama-3.1-8b)")
    tokenizer: str = field("", "tokenizer folder for --random-weights")
    device: str = field("auto", "cpu, cuda, cuda:N or auto")
    tp: int = field(
        1,
        "tensor-parallel size: the model split over this many ranks, one process per GPU "
        "(on CPU: processes), serving as one model service (docs/gpu.md)",
    )
    gpus: str = field(
        "",
        "GPU numbers (as CUDA numbers them here) for the ranks, rank r on the r-th, e.g. 0,1 "
        "(default: 0..tp-1); with --tp 1 the one GPU to use (as --device cuda:N)",
    )
    tp_rank: int = field(0, "internal: this process's rank (rank 0 sets it for its ranks)")
    tp_init: str = field("", "internal: the ranks' rendezvous address (rank 0 sets it)")
    tp_timeout_s: float = field(
        600.0, "a collective between the ranks that takes longer than this ends the group"
    )
    dtype: str = field("auto", "float32, bfloat16, float16 or auto (fp32 on CPU, bf16 on GPU)")
    attention: str = field(
        "auto", "reference, flashinfer or auto", choices=["auto", "reference", "flashinfer"]
    )
    kv_tokens: int = field(0, "KV pool size in tokens (0: from the memory budget)")
    kv_memory_gb: float = field(0.5, "KV memory budget on CPU, GiB")
    host_kv_tokens: int = field(
        0,
        "host-memory KV tier in tokens (issue 31; pinned memory on CUDA): the scheduler saves "
        "evicted KV there and loads hits back; 0 = off. The scheduler's --host-kv-tokens "
        "must be on too",
    )
    kv_memory_fraction: float = field(0.85, "fraction of free GPU memory for the KV pool")
    context_length: int = field(
        0, "longest prompt + output served, reported to the scheduler (0: the model's own)"
    )
    min_kv_tokens: int = field(
        0,
        "smallest KV pool sized from the memory budget that is worth serving, in tokens "
        "(0: min(context length, 4096)); below it start-up fails. --kv-tokens bypasses it",
    )
    cuda_graph_max_bs: int = field(
        128,
        "largest decode batch replayed from a CUDA graph (flashinfer only): buckets 1, 2, 4, "
        "8, ... up to it are captured at start-up; 0 turns CUDA graphs off",
    )
    mask_wait_s: float = field(
        5.0,
        "how long a step waits for grammar masks that follow it (StepMasks) before its rows "
        "fail with UNAVAILABLE and the step thread moves on",
    )
    max_handles: int = field(
        8192,
        "request handles a session may use (0..N-1; must exceed twice the scheduler's "
        "--max-running): larger handles are refused, so a peer cannot size the worker's tables",
    )
    nan_fill: bool = field(False, "debug: poison freed KV slots with NaN")
    threads: int = field(
        0,
        "torch intra-op threads, on CPU and on CUDA (the step's host-side work); 0: torch's "
        "default (every core) on CPU, CUDA_HOST_THREADS on CUDA",
    )
    watchdog_s: float = field(
        120.0,
        "liveness turns NOT_SERVING (so the supervisor restarts us) when a step has been "
        "running this long without finishing (a stuck step thread); above the 60 s a step "
        "may wait for late grammar masks",
    )

    def gpu_ids(self) -> list[int]:
        """--gpus as numbers ([] when not given)."""
        try:
            ids = [int(p) for p in self.gpus.replace(" ", "").split(",") if p]
        except ValueError as exc:
            raise ValueError(f"--gpus {self.gpus!r}: expected GPU numbers such as 0,1") from exc
        if len(set(ids)) != len(ids):
            raise ValueError(f"--gpus {self.gpus!r} names a GPU twice")
        return ids

    def validate(self) -> None:
        if self.tp < 1:
            raise ValueError("--tp must be >= 1")
        if not 0 <= self.tp_rank < self.tp:
            raise ValueError(f"--tp-rank {self.tp_rank} outside --tp {self.tp}")
        ids = self.gpu_ids()
        if ids and len(ids) != self.tp:
            raise ValueError(
                f"--gpus {self.gpus} names {len(ids)} GPUs for --tp {self.tp}: give one per rank"
            )
        if self.tp > 1 and self.device.startswith("cuda:"):
            raise ValueError("--tp > 1 places ranks with --gpus, not --device cuda:N")
        if self.tp_timeout_s <= 0:
            raise ValueError("--tp-timeout-s must be > 0")
        if not 0 < self.kv_memory_fraction <= 1:
            raise ValueError("--kv-memory-fraction must be in (0, 1]")
        if self.context_length < 0:
            raise ValueError("--context-length must be >= 0 (0: the model's own)")
        if self.host_kv_tokens < 0:
            raise ValueError("--host-kv-tokens must be >= 0")
        if self.kv_tokens < 0:
            raise ValueError("--kv-tokens must be >= 0")
        if self.min_kv_tokens < 0:
            raise ValueError("--min-kv-tokens must be >= 0")
        if not self.mask_wait_s > 0:
            raise ValueError("--mask-wait-s must be > 0")
        if self.max_handles < 1:
            raise ValueError("--max-handles must be >= 1")
        if self.cuda_graph_max_bs < 0:
            raise ValueError("--cuda-graph-max-bs must be >= 0 (0 turns CUDA graphs off)")
