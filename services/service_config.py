"""The fields every service's config shares: shutdown grace, logging and the metrics port, on top
of the transport-security ones (`TransportConfig`). Each service's `config.py` subclasses
`ServiceConfig` and adds its own fields, host and port defaults included; a service that needs
another default redefines the field (the front door's shorter grace). Importing this loads no
grpc."""

from __future__ import annotations

from dataclasses import dataclass

from services.config import field
from services.transport_config import TransportConfig


@dataclass
class ServiceConfig(TransportConfig):
    """Fields every service's config inherits (one flag set for all four services)."""

    shutdown_grace_s: float = field(
        35.0,
        "on SIGTERM: stop accepting and let open sessions run this long (they end sooner when "
        "their callers leave); keep it above the front door's grace",
    )
    log_level: str = field("info", "log level")
    metrics_port: int = field(0, "serve Prometheus /metrics on this port (0: off)")
    log_format: str = field("text", "log lines as key=value text or JSON", choices=["text", "json"])
