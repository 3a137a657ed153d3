"""python -m grammar_service [flags]: run the grammar service."""

from __future__ import annotations

from grammar_service.config import GrammarConfig
from grammar_service.server import serve
from radixmesh_server.config import parse_config
from radixmesh_server.logging import configure_logging
from radixmesh_server.security import configure_internal
from radixmesh_server.server import run


def main(argv: list[str] | None = None) -> None:
    cfg = parse_config(GrammarConfig, argv)
    configure_logging("grammar", cfg.log_level, json=cfg.log_format == "json")
    configure_internal(cfg)
    run(lambda: serve(cfg))


if __name__ == "__main__":
    main()
