"""SGLang's module path `sglang.lang.backend.runtime_endpoint`: `RuntimeEndpoint`, the backend
of a running server (RadixMesh's gRPC front door: `radixmesh.lang.grpc_backend`)."""

from __future__ import annotations

from radixmesh.lang.grpc_backend import GrpcBackend, RuntimeEndpoint

__all__ = ["GrpcBackend", "RuntimeEndpoint"]
