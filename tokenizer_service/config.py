"""Tokenizer service (front door) configuration."""

from __future__ import annotations

from dataclasses import dataclass

from radixmesh_server.config import field


@dataclass
class TokenizerConfig:
    """RadixMesh front door: tokenization, chat templates, detokenization, client streams."""

    host: str = field("127.0.0.1", "address to listen on")
    port: int = field(50051, "port to listen on (the public API)")
    scheduler_address: str = field("127.0.0.1:50052", "scheduler service address")
    model: str = field("default", "model folder (for the tokenizer), or 'default'")
    tokenizer: str = field("", "tokenizer folder if different from --model")
    default_max_new_tokens: int = field(128, "max_new_tokens when a request sets none")
    max_top_logprobs: int = field(20, "largest top_logprobs a request may ask for")
    max_input_chars: int = field(
        1_000_000, "most characters tokenized for one request (text, chat contents)"
    )
    max_request_bytes: int = field(8 << 20, "largest request message accepted (bytes)")
    tokenize_threads: int = field(2, "threads tokenizing long inputs off the event loop")
    log_level: str = field("info", "log level")
