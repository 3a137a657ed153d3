"""Prefill budget per step: the device's defaults, flags win, the decoding budget never
exceeds the idle one."""

from __future__ import annotations

from scheduler_service.planner.chunk_budget import ChunkBudget


def test_defaults_by_device() -> None:
    assert ChunkBudget.resolve(0, 0, "cpu") == ChunkBudget(512, 64)
    assert ChunkBudget.resolve(0, 0, "cuda:0") == ChunkBudget(2048, 2048)
    assert ChunkBudget.resolve(8192, 0, "cuda") == ChunkBudget(8192, 8192)


def test_flags_win_and_decoding_is_capped() -> None:
    b = ChunkBudget.resolve(4, 0, "cpu")
    assert b == ChunkBudget(4, 4) and b.for_step(decoding=True) == 4
    b = ChunkBudget.resolve(1024, 128, "cuda")
    assert b.for_step(decoding=False) == 1024 and b.for_step(decoding=True) == 128
