"""Transport security shared by every service: mutual TLS on internal links and the peer
identities it gives.

Internal links (front door -> scheduler -> model / grammar) use mutual TLS when a service is
given a CA, a certificate and a key (`--mtls-ca/--mtls-cert/--mtls-key`, or RADIXMESH_MTLS_*):
its server then refuses, during the TLS handshake, any client without a certificate from that
CA (no message is read), and its channels present its own certificate. A certificate's common
name is the caller's role (`tokenizer`, `scheduler`, `launcher`, ...): `require_peer` lets a
method admit only the roles that really call it. Without those files every link is plaintext
and no identity is checked (a laptop-only setup; `radixmesh serve` makes an ephemeral CA, see
`services.pki`).

Kubernetes gRPC probes cannot speak TLS: `--health-port` serves grpc.health.v1 alone in plaintext.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import structlog

from services.transport_config import TransportConfig

log = structlog.get_logger(__name__)


@dataclass(frozen=True)
class InternalTLS:
    ca: bytes
    cert: bytes
    key: bytes
    server_name: str

    @classmethod
    def from_config(cls, cfg: TransportConfig) -> InternalTLS | None:
        paths = (cfg.mtls_ca, cfg.mtls_cert, cfg.mtls_key)
        if not any(paths):
            return None
        if not all(paths):
            raise SystemExit(
                "internal mutual TLS needs all three of --mtls-ca, --mtls-cert and --mtls-key"
            )
        try:
            ca, cert, key = (Path(p).read_bytes() for p in paths)
        except OSError as exc:
            raise SystemExit(f"cannot read an internal TLS file: {exc}") from None
        return cls(ca, cert, key, cfg.mtls_server_name)

    def server_credentials(self) -> grpc.ServerCredentials:
        return grpc.ssl_server_credentials(
            [(self.key, self.cert)], root_certificates=self.ca, require_client_auth=True
        )

    def channel_credentials(self) -> grpc.ChannelCredentials:
        return grpc.ssl_channel_credentials(self.ca, self.key, self.cert)

    def channel_options(self) -> list[tuple[str, str]]:
        return [("grpc.ssl_target_name_override", self.server_name)] if self.server_name else []


def internal_channel(
    target: str, tls: InternalTLS | None, options: Sequence[tuple[str, Any]] = ()
) -> grpc.aio.Channel:
    """An asyncio channel to an internal peer: mutual TLS presenting `tls`, or plaintext."""
    if tls is None:
        return grpc.aio.insecure_channel(target, options=list(options))
    return grpc.aio.secure_channel(
        target, tls.channel_credentials(), options=[*options, *tls.channel_options()]
    )


_internal: InternalTLS | None = None


def configure_internal(cfg: TransportConfig) -> InternalTLS | None:
    """Read the process's internal TLS files once, at start-up (exits with a message if they
    are incomplete or unreadable)."""
    global _internal
    _internal = InternalTLS.from_config(cfg)
    log.info("internal_links", mtls=_internal is not None)
    return _internal


def internal_tls() -> InternalTLS | None:
    return _internal


def peer_role(context: grpc.aio.ServicerContext) -> str | None:
    """The caller's role: its certificate's common name (None without mutual TLS)."""
    names = context.auth_context().get("x509_common_name")
    return names[0].decode() if names else None


async def require_peer(context: grpc.aio.ServicerContext, *roles: str) -> None:
    """Abort with PERMISSION_DENIED unless the caller's certificate names one of `roles`.
    Without internal TLS there are no identities and every caller passes."""
    if _internal is None:
        return
    role = peer_role(context)
    if role not in roles:
        await context.abort(
            grpc.StatusCode.PERMISSION_DENIED,
            f"a {role or 'caller without a certificate'} may not call this "
            f"(only {', '.join(roles)})",
        )
