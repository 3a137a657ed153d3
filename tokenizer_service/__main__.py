"""python -m tokenizer_service [flags]: run the front door (the public API)."""

from __future__ import annotations

import asyncio
import gc
import ssl
import sys
from pathlib import Path

import grpc
import structlog

from radixmesh_wire.pb import api_pb2, api_pb2_grpc
from services.config import parse_config
from services.logging import configure_logging
from services.model_store import ModelError, resolve_model
from services.security import configure_internal
from services.server import Listen, run, run_server
from tokenizer_service.auth import ApiKeyInterceptor, ApiKeys
from tokenizer_service.config import TokenizerConfig
from tokenizer_service.core import FrontDoor
from tokenizer_service.http.app import build_app, start_http
from tokenizer_service.metrics import FrontDoorMetrics
from tokenizer_service.routing.replica_set import ReplicaSet
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
        reuse_port=cfg.reuse_port,
    )
    try:
        replicas = ReplicaSet.from_config(cfg)
    except ValueError as exc:
        raise SystemExit(f"tokenizer: {exc}") from None
    try:
        folder = resolve_model(cfg.tokenizer or cfg.model)
        tok = Tokenization(folder)
        if cfg.chat_template:
            tok.set_chat_template(_template_text(cfg.chat_template))
    except (ModelError, OSError) as exc:
        structlog.get_logger().error("startup_failed", error=str(exc))
        sys.exit(2)

    async def serve() -> None:
        metrics = FrontDoorMetrics()
        metrics.watch_replicas(replicas)
        metrics.serve(cfg.host, cfg.metrics_port, "tokenizer")
        core = FrontDoor(cfg, tok, replicas, metrics)

        def register(server, health):  # type: ignore[no-untyped-def]
            servicer = RadixMeshServicer(core, keys)
            api_pb2_grpc.add_RadixMeshServicer_to_server(servicer, server)
            return [api_pb2.DESCRIPTOR.services_by_name["RadixMesh"].full_name]

        def shutting_down() -> None:
            replicas.end_all(
                f"the front door is shutting down (--shutdown-grace-s={cfg.shutdown_grace_s:g}"
                " passed before this request finished); retry"
            )

        runner = None
        if cfg.http_port:
            app = build_app(core, cfg, str(folder), keys)
            try:
                runner = await start_http(
                    app, cfg.host, cfg.http_port, _http_tls(cfg), cfg.reuse_port
                )
            except OSError as exc:
                raise SystemExit(
                    f"tokenizer: cannot serve HTTP on port {cfg.http_port}: {exc}"
                ) from exc
        try:
            await run_server(
                "tokenizer",
                cfg.host,
                cfg.port,
                register,
                background=replicas.run,
                listen=listen,
                grace_s=cfg.shutdown_grace_s,
                before_cancel=shutting_down,
                max_receive_bytes=cfg.max_request_bytes,
            )
        finally:
            if runner is not None:
                await runner.cleanup()

    _event_loop(cfg.event_loop)
    _quiet_gc()
    run(serve)


def _quiet_gc() -> None:
    """Every streamed token allocates a few small objects, so the cyclic collector runs often;
    with the tokenizer's and the libraries' objects in the old generations its full passes
    showed as ~20% of the front door's profile under 1,024 streams. Those start-up objects
    live for the process: freeze them (never scanned again) and collect the young generation
    less often (a few MB more garbage held between passes)."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(20_000, 20, 20)


def _event_loop(choice: str) -> None:
    """uvloop when asked (or installed, with auto): the front door's cost is per streamed
    event (callbacks, socket writes), which uvloop runs in C; asyncio otherwise."""
    if choice == "asyncio":
        return
    try:
        import uvloop
    except ImportError:
        if choice == "uvloop":
            raise SystemExit(
                "tokenizer: --event-loop uvloop needs the PyPI package uvloop"
            ) from None
        return
    asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())


def _template_text(value: str) -> str:
    """--chat-template is a file path when one exists, else the template itself."""
    path = Path(value)
    return path.read_text() if path.is_file() else value


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


def _http_tls(cfg: TokenizerConfig) -> ssl.SSLContext | None:
    """The public TLS pair (--tls-cert/--tls-key) serves HTTPS on --http-port too."""
    if not (cfg.tls_cert and cfg.tls_key):
        return None
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ctx.load_cert_chain(cfg.tls_cert, cfg.tls_key)
    return ctx


if __name__ == "__main__":
    main()
