"""python -m scheduler_service [flags]: run the scheduler service."""

from __future__ import annotations

from radixmesh_wire.pb import scheduler_pb2, scheduler_pb2_grpc
from scheduler_service.config import SchedulerConfig
from scheduler_service.grammar.metrics import grammar_readings
from scheduler_service.links.frontend import SchedulerServicer
from scheduler_service.metrics import SchedulerMetrics
from scheduler_service.scheduler import Scheduler
from services.config import parse_config
from services.logging import configure_logging
from services.security import configure_internal
from services.server import Listen, run, run_server
from services.watchdog import Watchdog


def main(argv: list[str] | None = None) -> None:
    cfg = parse_config(SchedulerConfig, argv)
    configure_logging("scheduler", cfg.log_level, json=cfg.log_format == "json")
    configure_internal(cfg)

    async def serve() -> None:
        dog = Watchdog()
        sched = Scheduler(cfg, dog.progress("scheduler loop", cfg.watchdog_s))
        if cfg.metrics_port:
            sched.metrics = SchedulerMetrics(
                lambda: sched.st, cfg.max_running, cache_blocks=sched.feed.published_blocks
            )
            sched.metrics.readings(lambda: grammar_readings(sched.grammar))
            sched.metrics.serve(cfg.host, cfg.metrics_port, "scheduler")

        def register(server, health):  # type: ignore[no-untyped-def]
            scheduler_pb2_grpc.add_SchedulerServicer_to_server(SchedulerServicer(sched), server)
            return [scheduler_pb2.DESCRIPTOR.services_by_name["Scheduler"].full_name]

        await run_server(
            "scheduler",
            cfg.host,
            cfg.port,
            register,
            background=sched.run,
            listen=Listen(health_port=cfg.health_port),
            watchdog=dog,
            grace_s=cfg.shutdown_grace_s,
        )

    run(serve)


if __name__ == "__main__":
    main()
