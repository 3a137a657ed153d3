"""Tokenizer service (front door) configuration."""

from __future__ import annotations

from dataclasses import dataclass

from radixmesh_wire.step_ops import DEFAULTS
from services.config import field
from services.service_config import ServiceConfig


@dataclass
class TokenizerConfig(ServiceConfig):
    """RadixMesh front door: tokenization, chat templates, detokenization, client streams."""

    host: str = field("127.0.0.1", "address to listen on")
    port: int = field(50051, "port to listen on (the public API)")
    scheduler_address: str = field(
        "127.0.0.1:50052",
        "the scheduler replicas: host:port[,host:port...], dns:///name:port (every address the "
        "name resolves to) or file:PATH (one host:port a line); names and files are re-read "
        "every --resolve-interval-s",
    )
    resolve_interval_s: float = field(5.0, "re-resolve --scheduler-address this often (seconds)")
    router: str = field(
        "cache_aware",
        "how requests pick a replica: cache_aware (longest cached prefix unless overloaded), "
        "round_robin, least_load",
        choices=["cache_aware", "round_robin", "least_load"],
    )
    balance_abs_tokens: int = field(
        16384,
        "cache_aware: a replica is overloaded when its load (tokens of work queued + running) "
        "exceeds the least loaded replica's by more than this AND by more than --balance-rel "
        "times",
    )
    balance_abs_requests: int = field(
        32,
        "cache_aware: a replica is also overloaded when its requests (queued + running) exceed "
        "the least loaded replica's by more than this AND by more than --balance-rel times",
    )
    balance_rel: float = field(1.5, "cache_aware: the relative part of the overload rules")
    balance_share: float = field(
        1.5,
        "cache_aware: a replica that took more than this times an even share of the last "
        "--balance-window routing decisions gets no more cache hits until under it; the "
        "prefix goes to the least-loaded replica under its share (0: off)",
    )
    balance_window: int = field(64, "cache_aware: routing decisions --balance-share looks at")
    cache_threshold: float = field(
        0.5,
        "cache_aware: route on the cache only when a replica holds at least this fraction of "
        "the prompt's 16-token blocks; else to the least loaded",
    )
    approx_cache_blocks: int = field(
        65536,
        "for replicas that publish no cache events: remember at most this many 16-token "
        "blocks of the prompts routed to each (and no more than its KV pool holds)",
    )
    model: str = field("default", "model folder (for the tokenizer), or 'default'")
    tokenizer: str = field("", "tokenizer folder if different from --model")
    default_max_new_tokens: int = field(
        DEFAULTS.max_new_tokens, "max_new_tokens when a request sets none"
    )
    max_top_logprobs: int = field(20, "largest top_logprobs a request may ask for")
    http_port: int = field(8000, "HTTP port (OpenAI- and SGLang-compatible APIs); 0 = off")
    served_model_name: str = field("", "model name the HTTP APIs answer to (default: the model's)")
    chat_template: str = field("", "chat template (Jinja) file or text overriding the tokenizer's")
    tool_call_parser: str = field(
        "auto",
        "how tool calls are read out of the model's text: hermes (<tool_call> JSON: Hermes, "
        "Qwen), llama3 (a JSON object reply), auto (from the chat template; hermes when the "
        "template renders no tools, whose prompt the server then writes in that format)",
        choices=["auto", "hermes", "llama3"],
    )
    http_max_body_bytes: int = field(32 << 20, "largest HTTP request body (413 beyond it)")
    api_keys: str = field("", "comma-separated API keys; each key is its own tenant. Empty: open")
    admin_api_keys: str = field("", "comma-separated API keys that also have the admin scope")
    api_keys_file: str = field("", "file of API keys: `KEY [tenant=NAME] [admin]` a line")
    tls_cert: str = field("", "certificate (PEM) for TLS on the public port; empty: plaintext")
    tls_key: str = field("", "private key (PEM) of --tls-cert")
    scheduler_hold_s: float = field(
        60.0,
        "while the scheduler is away, hold live and new requests this long (readiness "
        "NOT_SERVING; live ones are resubmitted as continuations when it is back); then fail "
        "them with UNAVAILABLE and refuse new ones until it is back",
    )
    shutdown_grace_s: float = field(
        30.0,
        "on SIGTERM: stop accepting, let in-flight requests finish this long, then end the "
        "rest with UNAVAILABLE",
    )
    max_input_chars: int = field(
        1_000_000, "most characters tokenized for one request (text, chat contents)"
    )
    max_request_bytes: int = field(8 << 20, "largest request message accepted (bytes)")
    max_image_bytes: int = field(
        20 << 20, "multimodal models: largest encoded image (bytes; the request bound applies too)"
    )
    max_image_pixels: int = field(
        40_000_000, "multimodal models: most pixels (width x height) of one image, from its header"
    )
    max_images: int = field(16, "multimodal models: most images in one request")
    tokenize_threads: int = field(2, "threads tokenizing long inputs off the event loop")
    reuse_port: bool = field(
        False,
        "bind --port and --http-port with SO_REUSEPORT, so that several front doors share "
        "them and the kernel spreads the connections (each needs its own --metrics-port and "
        "--health-port)",
    )
    event_loop: str = field(
        "auto",
        "the event loop: uvloop (PyPI `uvloop`; cheaper per streamed event), asyncio, or auto "
        "(uvloop when installed)",
        choices=["auto", "uvloop", "asyncio"],
    )
    pacing_events_per_s: float = field(
        16000.0,
        "event budget: with more live streams than this x 10 ms, each stream's token events "
        "are spaced so that all of them together send about this many a second (tokens "
        "gather into fewer, fuller events; docs/front_door.md, Pacing); 0: off",
    )
    pacing_max_hold_ms: float = field(
        60.0, "the longest the event budget spaces a stream's events (milliseconds)"
    )

    def validate(self) -> None:
        if self.pacing_events_per_s < 0 or self.pacing_max_hold_ms < 0:
            raise ValueError("--pacing-events-per-s and --pacing-max-hold-ms must be >= 0")
