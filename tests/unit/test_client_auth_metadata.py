"""Both clients send the API key on every call kind: unary and server streaming (Generate).
The asyncio client once sent it on unary calls only (grpc.aio files an interceptor under one
call kind), so every AsyncClient stream to a keyed front door failed UNAUTHENTICATED."""

from __future__ import annotations

import asyncio
from typing import Any

import grpc
from radixmesh.transport import open_aio_channel, open_channel

from radixmesh_wire.pb import api_pb2, api_pb2_grpc


class _Echo(api_pb2_grpc.RadixMeshServicer):
    """Records the authorization header of each call (a fake front door, unit scope)."""

    def __init__(self) -> None:
        self.seen: list[tuple[str, str]] = []

    def _note(self, kind: str, context: Any) -> None:
        auth = dict(context.invocation_metadata()).get("authorization", "")
        self.seen.append((kind, auth))

    async def Generate(self, request: Any, context: Any) -> Any:  # noqa: N802
        self._note("stream", context)
        yield api_pb2.GenerateResponse()

    async def GetModelInfo(self, request: Any, context: Any) -> Any:  # noqa: N802
        self._note("unary", context)
        return api_pb2.ModelInfo()


def test_api_key_on_unary_and_streaming_calls() -> None:
    async def scenario() -> list[tuple[str, str]]:
        echo = _Echo()
        server = grpc.aio.server()
        api_pb2_grpc.add_RadixMeshServicer_to_server(echo, server)
        port = server.add_insecure_port("127.0.0.1:0")
        await server.start()
        try:
            addr = f"127.0.0.1:{port}"
            async with open_aio_channel(addr, [], api_key="k1") as chan:
                stub = api_pb2_grpc.RadixMeshStub(chan)
                await stub.GetModelInfo(api_pb2.GetModelInfoRequest())
                async for _ in stub.Generate(api_pb2.GenerateRequest()):
                    pass

            def sync_calls() -> None:
                with open_channel(addr, [], api_key="k2") as chan:
                    stub = api_pb2_grpc.RadixMeshStub(chan)
                    stub.GetModelInfo(api_pb2.GetModelInfoRequest())
                    list(stub.Generate(api_pb2.GenerateRequest()))

            await asyncio.to_thread(sync_calls)
        finally:
            await server.stop(None)
        return echo.seen

    assert asyncio.run(scenario()) == [
        ("unary", "Bearer k1"),
        ("stream", "Bearer k1"),
        ("unary", "Bearer k2"),
        ("stream", "Bearer k2"),
    ]
