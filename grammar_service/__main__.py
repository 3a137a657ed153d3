"""python -m grammar_service [flags]: run the grammar service."""

from __future__ import annotations

from grammar_service.config import GrammarConfig
from grammar_service.server import serve
from services.config import parse_config
from services.logging import configure_logging
from services.security import configure_internal
from services.server import run


def main(argv: list[str] | None = None) -> None:
    cfg = parse_config(GrammarConfig, argv)
    configure_logging("grammar", cfg.log_level, json=cfg.log_format == "json")
    configure_internal(cfg)
    run(lambda: serve(cfg))


if __name__ == "__main__":
    main()
