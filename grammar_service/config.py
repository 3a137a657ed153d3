"""Grammar service configuration (CLI flags and RADIXMESH_* environment variables)."""

from __future__ import annotations

from dataclasses import dataclass

from services.config import field
from services.service_config import ServiceConfig


@dataclass
class GrammarConfig(ServiceConfig):
    """RadixMesh grammar service: compiled-grammar cache, per-request matchers, masks."""

    host: str = field("127.0.0.1", "address to listen on")
    port: int = field(50054, "port to listen on")
    tokenizer: str = field("default", "HF tokenizer folder, or 'default' (SmolLM2-135M's)")
    vocab_size: int = field(0, "mask width: the model's logits width (0: the tokenizer's)")
    stop_token_ids: str = field("", "comma-separated ids that end a grammar (empty: tokenizer EOS)")
    max_cache_entries: int = field(1024, "compiled grammars kept (LRU)")
    max_cache_bytes: int = field(1 << 30, "bytes of compiled grammars kept (0: no byte bound)")
    compile_threads: int = field(2, "concurrent compiles (and xgrammar threads per compile)")
    compile_isolation: str = field(
        "process", "where compiles run: 'process' (killable workers) or 'thread' (in-process)"
    )
    compile_timeout_s: float = field(20.0, "seconds one grammar may compile (0: no limit)")
    compile_memory_mb: int = field(
        2048, "MiB one compile may allocate in its worker process (0: no limit)"
    )
    compile_small_chars: int = field(
        2048, "grammars this short get a compile worker of their own (with >= 2 workers)"
    )
    mask_threads: int = field(2, "threads running mask steps (sessions in parallel)")
    batch_fill_min_rows: int = field(8, "rows from which xgrammar's threaded batch fill is used")
    fill_threads: int = field(0, "xgrammar threads filling one step's masks (0: min(8, CPU cores))")
    inline_step_weight: int = field(4, "steps this light (rows + tokens) skip the thread hop")
    any_whitespace: bool = field(False, "JSON grammars allow free whitespace (off: compact JSON)")
    pattern_strings: bool = field(
        True, "compile maxLength-bounded JSON strings as patterns (fast masks, strict JSON)"
    )
    disable_xgrammar_cache: bool = field(False, "turn off xgrammar's own cache (cold benchmarks)")
    error_ttl_s: float = field(10.0, "seconds a compile error stays cached (0: not cached)")
    max_rollback_tokens: int = field(-1, "tokens a matcher may roll back (-1: unlimited)")
    jump_forward_window: int = field(8, "accepted tokens retokenized with a jump-forward string")
    jump_forward_max_bytes: int = field(512, "longest forced string one jump-forward proposes")
    jump_forward_max_steps: int = field(
        64, "mask fills one jump-forward search may do (it proposes what it found by then)"
    )
    watchdog_s: float = field(
        60.0,
        "liveness turns NOT_SERVING when a mask step has run this long (a stuck fill): the "
        "supervisor restarts the service and schedulers replay their requests elsewhere",
    )

    def validate(self) -> None:
        if self.max_cache_entries < 1:
            raise ValueError("--max-cache-entries must be >= 1")
        if self.compile_isolation not in ("process", "thread"):
            raise ValueError("--compile-isolation must be 'process' or 'thread'")
        if self.compile_timeout_s < 0 or self.compile_memory_mb < 0:
            raise ValueError("--compile-timeout-s and --compile-memory-mb must be >= 0")
        if self.fill_threads < 0:
            raise ValueError("--fill-threads must be >= 0 (0: automatic)")
        if self.compile_threads < 1 or self.mask_threads < 1:
            raise ValueError("--compile-threads and --mask-threads must be >= 1")
        if self.vocab_size < 0 or self.max_cache_bytes < 0:
            raise ValueError("--vocab-size and --max-cache-bytes must be >= 0")
        if 0 <= self.max_rollback_tokens < self.jump_forward_window:
            raise ValueError("--max-rollback-tokens must cover --jump-forward-window")
        if self.jump_forward_max_bytes < 1 or self.jump_forward_max_steps < 1:
            raise ValueError("--jump-forward-max-bytes and --jump-forward-max-steps must be > 0")
        if self.watchdog_s <= 0:
            raise ValueError("--watchdog-s must be > 0")
        self.parsed_stop_token_ids()

    def parsed_stop_token_ids(self) -> list[int] | None:
        text = self.stop_token_ids.strip()
        if not text:
            return None
        try:
            return [int(t) for t in text.split(",") if t.strip()]
        except ValueError as exc:
            raise ValueError(f"--stop-token-ids: {exc}") from exc
