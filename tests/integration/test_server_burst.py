"""A burst of streams (request rate inf) is served, not cancelled by the gRPC core.

gRPC cancels calls the asyncio server has not picked up yet beyond `max_pending_requests`
(default 1,000): 2,000 ShareGPT streams opened at once came back CANCELLED. Our servers raise
the bound (services.server.SERVER_OPTIONS); this opens 2,500 server streams at once.
"""

from __future__ import annotations

import asyncio

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from services.server import SERVER_OPTIONS

pytestmark = pytest.mark.integration  # starts processes or real servers

STREAMS = 2_500


class _Ticker(health_pb2_grpc.HealthServicer):
    async def Watch(self, request, context):  # type: ignore[no-untyped-def]  # noqa: N802
        for _ in range(2):
            yield health_pb2.HealthCheckResponse(status=health_pb2.HealthCheckResponse.SERVING)
            await asyncio.sleep(0)


async def _burst() -> list[object]:
    server = grpc.aio.server(options=SERVER_OPTIONS)
    health_pb2_grpc.add_HealthServicer_to_server(_Ticker(), server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as ch:
            stub = health_pb2_grpc.HealthStub(ch)

            async def one() -> int:
                return len([m async for m in stub.Watch(health_pb2.HealthCheckRequest())])

            return await asyncio.gather(*(one() for _ in range(STREAMS)), return_exceptions=True)
    finally:
        await server.stop(None)


def test_a_burst_of_streams_is_served_in_full() -> None:
    results = asyncio.run(_burst())
    errors = [r for r in results if not isinstance(r, int)]
    assert not errors, f"{len(errors)} of {STREAMS} streams failed, e.g. {errors[0]!r}"
    assert results == [2] * STREAMS
