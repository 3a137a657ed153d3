"""python -m tokenizer_service [flags]: run the front door (the public API)."""

from __future__ import annotations

import sys
from pathlib import Path

import grpc
import structlog

from radixmesh_server.config import parse_config
from radixmesh_server.logging import configure_logging
from radixmesh_server.metrics import serve_metrics
from radixmesh_server.model_store import ModelError, resolve_model
from radixmesh_server.security import configure_internal
from radixmesh_server.server import Listen, run, run_server
from radixmesh_wire.pb import api_pb2, api_pb2_grpc
from tokenizer_service.auth import ApiKeyInterceptor, ApiKeys
from tokenizer_service.config import TokenizerConfig
from tokenizer_service.metrics import FrontDoorMetrics
from tokenizer_service.scheduler_link import SchedulerLink
from tokenizer_service.server import RadixMeshServicer
from tokenizer_service.tokenization import Tokenization


def main(argv: list[str] | None = None) -> None:
    cfg = parse_config(TokenizerConfig, argv)
    configure_logging("tokenizer", cfg.log_level, json=cfg.log_format == "json")
    configure_internal(cfg)
    keys = ApiKeys.from_config(cfg.api_keys, cfg.admin_api_keys, cfg.api_keys_file)
    listen = Listen(
        public=True,
        credentials=_public_tls(cfg),
        interceptors=(ApiKeyInterceptor(keys),),
        health_port=cfg.health_port,
    )
    try:
        tok = Tokenization(resolve_model(cfg.tokenizer or cfg.model))
    except (ModelError, OSError) as exc:
        structlog.get_logger().error("startup_failed", error=str(exc))
        sys.exit(2)

    async def serve() -> None:
        link = SchedulerLink(cfg.scheduler_address)
        metrics = FrontDoorMetrics()
        serve_metrics(metrics.registry, cfg.host, cfg.metrics_port, "tokenizer")

        def register(server, health):  # type: ignore[no-untyped-def]
            servicer = RadixMeshServicer(cfg, tok, link, keys, metrics)
            api_pb2_grpc.add_RadixMeshServicer_to_server(servicer, server)
            return [api_pb2.DESCRIPTOR.services_by_name["RadixMesh"].full_name]

        await run_server(
            "tokenizer", cfg.host, cfg.port, register, background=link.run, listen=listen
        )

    run(serve)


def _public_tls(cfg: TokenizerConfig) -> grpc.ServerCredentials | None:
    if not cfg.tls_cert and not cfg.tls_key:
        return None
    if not (cfg.tls_cert and cfg.tls_key):
        raise SystemExit("TLS on the public port needs both --tls-cert and --tls-key")
    try:
        pair = (Path(cfg.tls_key).read_bytes(), Path(cfg.tls_cert).read_bytes())
    except OSError as exc:
        raise SystemExit(f"cannot read the public TLS files: {exc}") from None
    return grpc.ssl_server_credentials([pair])


if __name__ == "__main__":
    main()
