"""Which service answered? A client pointed at an internal port (scheduler, model, grammar)
gets UNIMPLEMENTED for every public method; `radixmesh.api` then asks the server's reflection
what it serves and says which service that is and where the API is."""

from __future__ import annotations

import grpc

API_SERVICE = "radixmesh.v1.RadixMesh"
# The internal services' gRPC names: a client pointed at one of these ports gets UNIMPLEMENTED.
INTERNAL_SERVICES = {
    "radixmesh.v1.Scheduler": "scheduler service",
    "radixmesh.v1.ModelWorker": "model service",
    "radixmesh.v1.Grammar": "grammar service",
}
_API_HINT = (
    "the API is the tokenizer service's port, the one `radixmesh serve` prints as "
    "'API at ...' (localhost:50051 by default)"
)


def served_services(endpoint: str, timeout: float = 2.0) -> list[str] | None:
    """The gRPC services the server at `endpoint` lists through reflection (every RadixMesh
    service enables it), or None where it cannot say (no grpcio-reflection here, none there)."""
    try:
        from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc
    except ImportError:  # the client needs only grpcio + protobuf; the server side has it
        return None
    with grpc.insecure_channel(endpoint) as chan:
        stub = reflection_pb2_grpc.ServerReflectionStub(chan)
        req = reflection_pb2.ServerReflectionRequest(list_services="")
        try:
            for resp in stub.ServerReflectionInfo(iter([req]), timeout=timeout):
                return [s.name for s in resp.list_services_response.service]
        except grpc.RpcError:
            return None
    return None


def wrong_service_message(endpoint: str, services: list[str] | None) -> str | None:
    """What to tell a caller who got UNIMPLEMENTED from `endpoint`; None where the server does
    serve the API (a genuine UNIMPLEMENTED, whose own message stands)."""
    if services is not None and API_SERVICE in services:
        return None
    internal = [INTERNAL_SERVICES[s] for s in services or () if s in INTERNAL_SERVICES]
    if internal:
        return (
            f"{endpoint} is RadixMesh's {internal[0]}, an internal port, not the API: {_API_HINT}"
        )
    if services is not None:
        listed = ", ".join(s for s in services if not s.startswith("grpc.")) or "nothing else"
        return f"{endpoint} does not serve the RadixMesh API (it serves {listed}): {_API_HINT}"
    return (
        f"{endpoint} does not serve the RadixMesh API ({API_SERVICE}); is it an internal "
        f"service's port? {_API_HINT}"
    )
