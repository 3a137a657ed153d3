"""Small pieces the model-service unit tests share: a tiny random Llama's shapes, and a copy
lane that defers the copy stream's work until something waits for it."""

from __future__ import annotations

from collections.abc import Callable

import torch

from model_service.kv_copy import Event, Lane
from model_service.models.llama import LlamaArgs


def tiny_llama_args(vocab_size: int) -> LlamaArgs:
    """2 layers, 4 query heads over 2 KV heads of 32: fast on CPU, GQA like the real models."""
    return LlamaArgs(
        vocab_size=vocab_size,
        hidden_size=128,
        intermediate_size=192,
        num_layers=2,
        num_heads=4,
        num_kv_heads=2,
        head_dim=32,
        rms_norm_eps=1e-5,
        rope_theta=10000.0,
        rope_scaling=None,
        max_position=4096,
        tie_word_embeddings=False,
        attention_bias=False,
        model_type="llama",
    )


class DeferredLane(Lane):
    """A copy stream that runs queued work only when something waits for it: the CPU
    (``wait_cpu``, through an event's ``synchronize``) or the compute stream (``release_main``,
    due when the test's "main" next touches the GPU pool: ``main()``). A wait the copier
    forgets shows as stale bytes. ``waits``: the queue positions the compute stream waited for."""

    def __init__(self) -> None:
        super().__init__(torch.device("cpu"))
        self.queue: list[Callable[[], object]] = []
        self.done = 0
        self.main_at = 0  # queue position the compute stream waits for
        self.waits: list[int] = []

    def run(self, fn: Callable[[], object]) -> None:
        self.queue.append(fn)

    def mark(self) -> Event:
        return _Mark(self, len(self.queue))

    def release_main(self, ev: Event | None) -> None:
        if isinstance(ev, _Mark):
            self.waits.append(ev.at)
            self.main_at = max(self.main_at, ev.at)

    def flush(self, upto: int) -> None:
        while self.done < upto:
            self.done += 1
            self.queue[self.done - 1]()

    def main(self) -> None:
        """The compute stream is about to touch the GPU pool."""
        self.flush(self.main_at)


class _Mark:
    def __init__(self, lane: DeferredLane, at: int) -> None:
        self.lane, self.at = lane, at

    def synchronize(self) -> None:
        self.lane.flush(self.at)
