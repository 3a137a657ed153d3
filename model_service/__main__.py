"""python -m model_service [flags]: run the model service."""

from __future__ import annotations

import sys

import structlog

from model_service.config import ModelServiceConfig
from services.config import parse_config
from services.logging import configure_logging
from services.model_store import ModelError
from services.security import configure_internal
from services.server import Listen, run, run_server
from services.watchdog import Watchdog


def main(argv: list[str] | None = None) -> None:
    cfg = parse_config(ModelServiceConfig, argv)
    configure_logging("model", cfg.log_level, json=cfg.log_format == "json")
    configure_internal(cfg)
    from model_service.engine import build_engine
    from model_service.server import ModelWorkerServicer
    from radixmesh_wire.pb import model_pb2, model_pb2_grpc

    try:
        engine = build_engine(cfg)
    except (ModelError, ValueError, OSError) as exc:
        structlog.get_logger().error("startup_failed", error=str(exc))
        sys.exit(2)
    dog = Watchdog()
    servicer = ModelWorkerServicer(
        engine, cfg.mask_wait_s, cfg.max_handles, dog.progress("model step", cfg.watchdog_s)
    )
    if cfg.metrics_port:
        from model_service.metrics import ModelMetrics

        servicer.metrics = ModelMetrics(int(engine.runner.pool.capacity))
        servicer.metrics.serve(cfg.host, cfg.metrics_port, "model")

    def register(server, health):  # type: ignore[no-untyped-def]
        model_pb2_grpc.add_ModelWorkerServicer_to_server(servicer, server)
        return [model_pb2.DESCRIPTOR.services_by_name["ModelWorker"].full_name]

    listen = Listen(health_port=cfg.health_port)
    run(
        lambda: run_server(
            "model",
            cfg.host,
            cfg.port,
            register,
            listen=listen,
            watchdog=dog,
            grace_s=cfg.shutdown_grace_s,
        )
    )


if __name__ == "__main__":
    main()
