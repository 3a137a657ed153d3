"""The one gRPC serving client of the benchmarks (radixmesh_bench/serving_clients.py), shared by
`bench serving` (send_grpc) and the GPU parts (gpu/serving_client.timed_stream): both read the
same timed stream, each with its own counting rules. A scripted stream and a fake clock: the
figures are exact."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from types import SimpleNamespace
from typing import Any

import grpc
import pytest
from radixmesh.api import Chunk, GenerateResult, RadixMeshError

from radixmesh_bench import serving_clients
from radixmesh_bench.gpu import serving_client
from radixmesh_bench.serving_clients import Req, chunk_gaps, send_grpc


def result(completion: int) -> GenerateResult:
    return GenerateResult("r", "", [7] * completion, "length", "", 3, completion, 0, [], [], 0)


class ScriptedClient:
    """Yields (time, item) pairs, moving the fake clock to each time before the item."""

    def __init__(self, clock: list[float], script: list[tuple[float, Any]]) -> None:
        self.clock, self.script = clock, script
        self.calls: list[tuple[tuple[Any, ...], dict[str, Any]]] = []

    async def stream(self, *args: Any, **kw: Any) -> AsyncIterator[Any]:
        self.calls.append((args, kw))
        for t, item in self.script:
            self.clock[0] = t
            if isinstance(item, Exception):
                raise item
            yield item
        self.clock[0] += 0.5  # the stream's end comes after its last item


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    now = [0.0]
    monkeypatch.setattr(serving_clients, "time", SimpleNamespace(perf_counter=lambda: now[0]))
    return now


SCRIPT: list[tuple[float, Any]] = [
    (1.0, Chunk("ab", [1, 2], 0)),
    (1.5, Chunk("", [], 1)),  # a rollback alone: no token
    (2.5, Chunk("c", [3], 0)),
    (3.0, result(3)),
]


def test_chunk_gaps_count_k_gaps_per_chunk() -> None:
    assert chunk_gaps([]) == []
    assert chunk_gaps([(1.0, 2)]) == []
    assert chunk_gaps([(1.0, 1), (2.0, 4)]) == [0.25] * 4
    assert chunk_gaps([(1.0, 1), (1.5, 0), (3.5, 2)]) == [0.5, 1.0, 1.0]


def test_bench_serving_counts_only_chunks_with_tokens(clock: list[float]) -> None:
    client = ScriptedClient(clock, SCRIPT)
    out = asyncio.run(send_grpc(client, Req("hi", 1, 3)))
    assert out.ok and out.error == ""
    assert out.ttft == 1.0
    assert out.itl == [1.5]  # 1.0 -> 2.5, one token; the empty chunk is not a gap
    assert out.output_len == 3
    assert out.latency == 3.5
    assert client.calls == [(("hi",), {"max_new_tokens": 3, "temperature": 0, "ignore_eos": True})]


def test_bench_serving_reports_a_failed_stream(clock: list[float]) -> None:
    lost = RadixMeshError(grpc.StatusCode.UNAVAILABLE, "gone")
    client = ScriptedClient(clock, [(1.0, Chunk("a", [1], 0)), (2.0, lost)])
    out = asyncio.run(send_grpc(client, Req("hi", 1, 3)))
    assert not out.ok and "gone" in out.error


def test_gpu_parts_count_every_chunk(clock: list[float]) -> None:
    client = ScriptedClient(clock, SCRIPT)
    got = asyncio.run(serving_client.timed_stream(client, [5, 6, 7], 3))
    assert got["ttft"] == 1.0 and got["e2e"] == 3.5
    assert got["itl"] == [0.5, 1.0]  # the empty chunk counts as one gap
    assert got["tokens"] == [7, 7, 7]
    assert (got["completion_tokens"], got["prompt_tokens"], got["finish"]) == (3, 3, "length")
    assert client.calls == [
        ((), {"input_ids": [5, 6, 7], "max_new_tokens": 3, "ignore_eos": True, "temperature": 0.0})
    ]


def test_gpu_parts_without_a_result(clock: list[float]) -> None:
    client = ScriptedClient(clock, [])
    got = asyncio.run(serving_client.timed_stream(client, [1], 2))
    assert got["ttft"] == got["e2e"] == 0.5  # no chunk: TTFT is the end of the stream
    assert (got["tokens"], got["completion_tokens"], got["finish"]) == ([], 0, "none")
