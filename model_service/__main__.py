"""python -m model_service [flags]: run the model service.

With `--tp N` this process is rank 0 of N: it starts ranks 1..N-1 (the same command with
`--tp-rank r`), which build their shard of the model and then run every step rank 0 forwards;
only rank 0 serves gRPC (model_service/tp/).
"""

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


def _placement(cfg: ModelServiceConfig, argv: list[str]):  # type: ignore[no-untyped-def]
    """(shard, comm, device) of this process: no group at --tp 1 (device from --gpus or
    --device); at --tp N rank 0 starts the other ranks first, then every rank joins."""
    import torch

    from model_service.engine import pick_device
    from model_service.tp.shard import ONE, Shard

    base = pick_device(cfg.device)
    ids = cfg.gpu_ids()
    if cfg.tp == 1:
        if ids and base.type == "cuda":
            return ONE, None, torch.device("cuda", ids[0])
        return ONE, None, base
    from model_service.tp import group
    from model_service.tp.comm import open_store

    shard = Shard(cfg.tp_rank, cfg.tp)
    device = group.rank_device(base, ids, cfg.tp, cfg.tp_rank)
    init, store = cfg.tp_init, None
    if shard.rank == 0:
        from model_service.engine import model_config

        model_config(cfg)  # an unsupported model or split fails here, before any rank starts
        store = open_store(cfg.tp, cfg.tp_timeout_s)
        init = f"tcp://127.0.0.1:{store.port}"
        group.start_children(argv, cfg.tp, init)
    else:
        group.watch_leader()
    comm = group.join_group(shard, device, init, cfg.tp_timeout_s, cfg.threads, store)
    return shard, comm, device


def main(argv: list[str] | None = None) -> None:
    argv = list(sys.argv[1:] if argv is None else argv)
    cfg = parse_config(ModelServiceConfig, argv)
    name = "model" if cfg.tp_rank == 0 else f"model-rank{cfg.tp_rank}"
    configure_logging(name, cfg.log_level, json=cfg.log_format == "json")
    configure_internal(cfg)
    from model_service.engine import build_engine
    from model_service.server import ModelWorkerServicer
    from radixmesh_wire.pb import model_pb2, model_pb2_grpc

    try:
        shard, comm, device = _placement(cfg, argv)
        engine = build_engine(cfg, shard, comm, device)
    except (ModelError, ValueError, OSError) as exc:
        structlog.get_logger().error("startup_failed", error=str(exc), tp_rank=cfg.tp_rank)
        sys.exit(2)
    if comm is not None and shard.rank > 0:
        from model_service.tp.steps import serve_rank

        serve_rank(engine.runner, comm)  # until the group ends
        return
    dog = Watchdog()
    servicer = ModelWorkerServicer(
        engine, cfg.mask_wait_s, cfg.max_handles, dog.progress("model step", cfg.watchdog_s)
    )
    if comm is not None:
        from model_service.tp.steps import Leader

        servicer.tp = Leader(comm)
    if cfg.metrics_port:
        from model_service.metrics import ModelMetrics
        from services.metrics import serve_metrics

        pool = engine.runner.pool
        copies = pool.copy_stats if pool.host_capacity else None
        servicer.metrics = ModelMetrics(int(pool.capacity), copies=copies)
        serve_metrics(servicer.metrics.registry, cfg.host, cfg.metrics_port, "model")

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
