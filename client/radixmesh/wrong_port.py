"""Which service answered? A client pointed at an internal port (scheduler, model, grammar)
fails: UNIMPLEMENTED where internal links are plaintext (the server's reflection then says what
it serves), UNAVAILABLE where they use mutual TLS, as `radixmesh serve` runs them (the server's
certificate, read in a TLS handshake that needs no client certificate, names its role).
`radixmesh.api` turns either into a message naming the service and where the API is."""

from __future__ import annotations

import socket
import ssl

import grpc

# The name every internal certificate carries (services.security.INTERNAL_SERVER_NAME;
# the client does not import the server package).
INTERNAL_CERT_NAME = b"radixmesh-internal"
_CN_OID = bytes([0x06, 0x03, 0x55, 0x04, 0x03])  # DER: OBJECT IDENTIFIER 2.5.4.3 (commonName)

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


def served_services(chan: grpc.Channel, timeout: float = 2.0) -> list[str] | None:
    """The gRPC services the server behind `chan` lists through reflection (every RadixMesh
    service enables it), or None where it cannot say (no grpcio-reflection here, none there).
    The caller's channel, so its TLS and API key go along."""
    try:
        from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc
    except ImportError:  # the client needs only grpcio + protobuf; the server side has it
        return None
    stub = reflection_pb2_grpc.ServerReflectionStub(chan)
    req = reflection_pb2.ServerReflectionRequest(list_services="")
    try:
        for resp in stub.ServerReflectionInfo(iter([req]), timeout=timeout):
            return [s.name for s in resp.list_services_response.service]
    except grpc.RpcError:
        return None
    return None


def tls_internal_role(endpoint: str, timeout: float = 1.0) -> str | None:
    """The role (its certificate's common name) of a RadixMesh internal TLS port at `endpoint`,
    or None where it is not one (nothing listens, plaintext, another certificate)."""
    host, _, port = endpoint.rpartition(":")
    ctx = ssl.create_default_context()
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE  # identify only: nothing is sent over this connection
    ctx.set_alpn_protocols(["h2"])
    try:
        with (
            socket.create_connection((host.strip("[]"), int(port)), timeout) as raw,
            ctx.wrap_socket(raw, server_hostname=INTERNAL_CERT_NAME.decode()) as tls,
        ):
            der = tls.getpeercert(binary_form=True)
    except (OSError, ValueError):
        return None
    if not der or INTERNAL_CERT_NAME not in der:
        return None
    return _last_common_name(der)


def _last_common_name(der: bytes) -> str | None:
    """The subject's CN: DER lists the issuer's name before the subject's, so the last one."""
    found = None
    at = der.find(_CN_OID)
    while at >= 0:
        i = at + len(_CN_OID)
        if i + 2 <= len(der) and der[i] in (0x0C, 0x13) and der[i + 1] < 0x80:  # short string
            found = der[i + 2 : i + 2 + der[i + 1]].decode("utf-8", "replace")
        at = der.find(_CN_OID, at + 1)
    return found


def internal_tls_message(endpoint: str, role: str) -> str:
    return (
        f"{endpoint} is RadixMesh's {role} service, an internal port (mutual TLS), not the "
        f"API: {_API_HINT}"
    )


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
