"""The transport-security settings every service's config inherits (kept apart from
`services.security` so that importing a config loads no grpc)."""

from __future__ import annotations

from dataclasses import dataclass

from services.config import field

INTERNAL_SERVER_NAME = "radixmesh-internal"


@dataclass
class TransportConfig:
    """Fields every service's config inherits (one flag set for the internal links)."""

    mtls_ca: str = field("", "CA bundle (PEM) for mutual TLS on internal links; empty: plaintext")
    mtls_cert: str = field("", "this service's certificate (PEM) for internal links")
    mtls_key: str = field("", "this service's private key (PEM) for internal links")
    mtls_server_name: str = field(
        INTERNAL_SERVER_NAME, "name the internal peers' certificates carry (checked by clients)"
    )
    health_port: int = field(
        0, "plaintext port serving only grpc.health.v1 (for probes that cannot do TLS); 0: off"
    )
