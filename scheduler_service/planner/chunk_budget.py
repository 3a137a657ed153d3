"""How many prompt tokens one step may prefill (chunked prefill).

A step's time grows with its prefill tokens, and every request decoding in that step waits for
it: so the budget while requests decode bounds the stall of each of their tokens to one step
with at most `decoding` prefill tokens. With nothing decoding, a larger budget buys prefill
throughput. On a CPU a 2,048-token chunk of SmolLM2-135M is seconds, so both default lower
there (measured: tests/load/prefill_stall.py, docs/architecture.md "Chunked prefill").
"""

from __future__ import annotations

from dataclasses import dataclass

GPU_CHUNK = 2048
CPU_CHUNK = 512
CPU_DECODING_CHUNK = 64


@dataclass(frozen=True)
class ChunkBudget:
    idle: int  # prefill tokens per step while no request decodes
    decoding: int  # while some request decodes (<= idle)

    @staticmethod
    def resolve(chunk_tokens: int, decode_chunk_tokens: int, device: str) -> ChunkBudget:
        """0 means the device's default for either flag."""
        cpu = not device.startswith("cuda")
        idle = chunk_tokens or (CPU_CHUNK if cpu else GPU_CHUNK)
        decoding = decode_chunk_tokens or (CPU_DECODING_CHUNK if cpu else idle)
        return ChunkBudget(idle, min(decoding, idle))

    def for_step(self, decoding: bool) -> int:
        return self.decoding if decoding else self.idle
