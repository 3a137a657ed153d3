"""Tokenizer service (front door) configuration."""

from __future__ import annotations

from dataclasses import dataclass

from radixmesh_server.config import field
from radixmesh_server.security import TransportConfig


@dataclass
class TokenizerConfig(TransportConfig):
    """RadixMesh front door: tokenization, chat templates, detokenization, client streams."""

    host: str = field("127.0.0.1", "address to listen on")
    port: int = field(50051, "port to listen on (the public API)")
    scheduler_address: str = field("127.0.0.1:50052", "scheduler service address")
    model: str = field("default", "model folder (for the tokenizer), or 'default'")
    tokenizer: str = field("", "tokenizer folder if different from --model")
    default_max_new_tokens: int = field(128, "max_new_tokens when a request sets none")
    max_top_logprobs: int = field(20, "largest top_logprobs a request may ask for")
    api_keys: str = field("", "comma-separated API keys; each key is its own tenant. Empty: open")
    admin_api_keys: str = field("", "comma-separated API keys that also have the admin scope")
    api_keys_file: str = field("", "file of API keys: `KEY [tenant=NAME] [admin]` a line")
    tls_cert: str = field("", "certificate (PEM) for TLS on the public port; empty: plaintext")
    tls_key: str = field("", "private key (PEM) of --tls-cert")
    log_level: str = field("info", "log level")
    metrics_port: int = field(0, "serve Prometheus /metrics on this port (0: off)")
    log_format: str = field("text", "log lines as key=value text or JSON", choices=["text", "json"])
