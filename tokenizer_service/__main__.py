"""python -m tokenizer_service [flags]: run the front door (the public API)."""

from __future__ import annotations

import sys

import structlog

from radixmesh_server.config import parse_config
from radixmesh_server.logging import configure_logging
from radixmesh_server.model_store import ModelError, resolve_model
from radixmesh_server.server import run, run_server
from radixmesh_wire.pb import api_pb2, api_pb2_grpc
from tokenizer_service.config import TokenizerConfig
from tokenizer_service.scheduler_link import SchedulerLink
from tokenizer_service.server import RadixMeshServicer
from tokenizer_service.tokenization import Tokenization


def main(argv: list[str] | None = None) -> None:
    cfg = parse_config(TokenizerConfig, argv)
    configure_logging("tokenizer", cfg.log_level)
    try:
        tok = Tokenization(resolve_model(cfg.tokenizer or cfg.model))
    except (ModelError, OSError) as exc:
        structlog.get_logger().error("startup_failed", error=str(exc))
        sys.exit(2)

    async def serve() -> None:
        link = SchedulerLink(cfg.scheduler_address)

        def register(server, health):  # type: ignore[no-untyped-def]
            api_pb2_grpc.add_RadixMeshServicer_to_server(RadixMeshServicer(cfg, tok, link), server)
            return [api_pb2.DESCRIPTOR.services_by_name["RadixMesh"].full_name]

        await run_server(
            "tokenizer",
            cfg.host,
            cfg.port,
            register,
            background=link.run,
            max_receive_bytes=cfg.max_request_bytes,
        )

    run(serve)


if __name__ == "__main__":
    main()
