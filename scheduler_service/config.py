"""Scheduler service configuration (CLI flags and RADIXMESH_* environment variables)."""

from __future__ import annotations

from dataclasses import dataclass

from radixmesh_server.config import field
from radixmesh_server.security import TransportConfig


@dataclass
class SchedulerConfig(TransportConfig):
    """RadixMesh scheduler: radix cache, waiting queue, continuous batching."""

    host: str = field("127.0.0.1", "address to listen on")
    port: int = field(50052, "port to listen on")
    model_address: str = field("127.0.0.1:50053", "model service address")
    grammar_address: str = field("127.0.0.1:50054", "grammar service address")
    radix: str = field(
        "tree",
        "prefix cache: tree, table (flat exact-prefix) or off",
        choices=["tree", "table", "off"],
    )
    eviction: str = field(
        "lru",
        "radix cache eviction order: lru, or lfu (fewest uses first, ties LRU)",
        choices=["lru", "lfu"],
    )
    protect_ms: float = field(
        100.0,
        "keep freshly inserted cache (a finished request's context) out of admission's reach "
        "for this long while other work runs, so a follow-up call finds it; 0 disables",
    )
    policy: str = field(
        "lpm", "waiting-queue order", choices=["lpm", "dfs-weight", "fcfs", "lof", "random"]
    )
    lpm_fallback_queue_len: int = field(128, "above this many waiting, LPM becomes FCFS")
    in_batch_prefix_tokens: int = field(
        8,
        "in-batch prefix sharing: of waiting requests sharing at least this many uncached "
        "tokens after the same cached prefix, admit one now and the rest next round; 0 disables",
    )
    chunk_tokens: int = field(2048, "prefill token budget per step (chunked prefill)")
    max_running: int = field(256, "most requests decoding at once")
    max_queue: int = field(4096, "waiting-queue bound; beyond it RESOURCE_EXHAUSTED")
    new_token_ratio: float = field(
        0.7,
        "initial expected fraction of max_new_tokens still to "
        "come (decays while no retraction happens)",
    )
    jump_forward: str = field(
        "on", "compressed-FSM jump-forward for constrained requests", choices=["on", "off"]
    )
    overlap: str = field(
        "on",
        "send step N+1 before step N's tokens are back (the worker resolves them on the "
        "device), so scheduling and the gRPC hop hide behind the forward pass",
        choices=["on", "off"],
    )
    debug_invariants: bool = field(False, "check the KV accounting invariant after every step")
    log_level: str = field("info", "log level")
    metrics_port: int = field(0, "serve Prometheus /metrics on this port (0: off)")
    log_format: str = field("text", "log lines as key=value text or JSON", choices=["text", "json"])

    def validate(self) -> None:
        if self.chunk_tokens < 1:
            raise ValueError("--chunk-tokens must be >= 1")
        if self.in_batch_prefix_tokens < 0:
            raise ValueError("--in-batch-prefix-tokens must be >= 0")
        if self.protect_ms < 0:
            raise ValueError("--protect-ms must be >= 0")
        if self.max_running < 1 or self.max_queue < 1:
            raise ValueError("--max-running and --max-queue must be >= 1")
