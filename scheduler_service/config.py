"""Scheduler service configuration (CLI flags and RADIXMESH_* environment variables)."""

from __future__ import annotations

from dataclasses import dataclass

from services.config import field
from services.discovery import parse_address_spec
from services.service_config import ServiceConfig


@dataclass
class SchedulerConfig(ServiceConfig):
    """RadixMesh scheduler: radix cache, waiting queue, continuous batching."""

    host: str = field("127.0.0.1", "address to listen on")
    port: int = field(50052, "port to listen on")
    model_address: str = field("127.0.0.1:50053", "model service address")
    grammar_address: str = field(
        "127.0.0.1:50054",
        "grammar services: host:port[,host:port...], dns:///name:port or file:PATH (re-read "
        "while running); constrained requests are spread over them",
    )
    grammar_discovery_s: float = field(
        5.0, "re-resolve a dns:/// or file: --grammar-address this often (seconds)"
    )
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
    host_kv_tokens: int = field(
        0,
        "host-memory KV tier under the radix tree, in tokens (issue 31): GPU eviction saves KV "
        "there and a later hit loads it back instead of recomputing; 0 = off. The model "
        "service's --host-kv-tokens must be on too (the smaller of the two is used)",
    )
    host_tier_write: str = field(
        "write_back",
        "host KV tier write policy: write_back (copy a node to the host when GPU eviction takes "
        "it) or write_through (copy a finished request's KV at once, a bounded share per step, "
        "so eviction only frees GPU slots); docs/radix.md has both measured",
        choices=["write_back", "write_through"],
    )
    protect_ms: float = field(
        100.0,
        "keep freshly inserted cache (a finished request's context) out of admission's reach "
        "for this long while other work runs, so a follow-up call finds it; 0 disables",
    )
    cache_events: str = field(
        "on",
        "publish the prefix cache's blocks (inserts, evictions) to every front-door session, "
        "for cache-aware routing over replicas (only --radix tree has blocks to publish); "
        "load reports go out either way",
        choices=["on", "off"],
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
    chunk_tokens: int = field(
        0,
        "prefill token budget per step while no request decodes (chunked prefill); "
        "0: 2048 on a GPU model, 512 on a CPU one",
    )
    decode_chunk_tokens: int = field(
        0,
        "prefill token budget per step while requests decode: each of their tokens waits at "
        "most one step with this many prefill tokens; 0: --chunk-tokens on a GPU, 64 on a CPU",
    )
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
    model_probe_s: float = field(
        1.0,
        "ask the model's liveness this often; two unanswered (or NOT_SERVING) probes in a row "
        "count as losing it (running requests then wait as continuations)",
    )
    model_hold_s: float = field(
        60.0,
        "while the model service is away, hold queued work this long (readiness NOT_SERVING); "
        "then fail it with UNAVAILABLE and refuse new work until the model is back",
    )
    watchdog_s: float = field(
        30.0,
        "liveness turns NOT_SERVING (so the supervisor restarts us) when the scheduling loop "
        "has work but made no progress for this long, or died",
    )
    max_top_logprobs: int = field(
        64, "largest top_logprobs a submission may ask for (>= the front door's limit)"
    )
    debug_invariants: bool = field(False, "check the KV accounting invariant after every step")

    def validate(self) -> None:
        if self.chunk_tokens < 0 or self.decode_chunk_tokens < 0:
            raise ValueError("--chunk-tokens and --decode-chunk-tokens must be >= 0 (0: auto)")
        if self.in_batch_prefix_tokens < 0:
            raise ValueError("--in-batch-prefix-tokens must be >= 0")
        if self.protect_ms < 0:
            raise ValueError("--protect-ms must be >= 0")
        if self.host_kv_tokens < 0 or (self.host_kv_tokens and self.radix != "tree"):
            raise ValueError("--host-kv-tokens must be >= 0 and needs --radix tree")
        if self.model_probe_s <= 0 or self.model_hold_s < 0:
            raise ValueError("--model-probe-s must be > 0 and --model-hold-s >= 0")
        if self.max_top_logprobs < 0:
            raise ValueError("--max-top-logprobs must be >= 0")
        if self.grammar_discovery_s <= 0:
            raise ValueError("--grammar-discovery-s must be > 0")
        parse_address_spec(self.grammar_address)  # ValueError names what is wrong
        if self.max_running < 1 or self.max_queue < 1:
            raise ValueError("--max-running and --max-queue must be >= 1")
