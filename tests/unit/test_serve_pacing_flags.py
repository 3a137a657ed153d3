"""`radixmesh serve --pacing-events-per-s / --pacing-max-hold-ms` reach every front door under
the front door's own flag names, and only when given (the front door keeps its defaults)."""

from __future__ import annotations

from services.cli import build_parser
from services.config import parse_config
from services.placement import plan_placement
from services.serve_cmd import service_args
from tokenizer_service.config import TokenizerConfig


def _tokenizer_args(*flags: str) -> list[str]:
    ns = build_parser().parse_args(["serve", "--device", "cpu", *flags])
    p = plan_placement([], gpus=ns.gpus, tp=ns.tp, replicas=ns.replicas)
    return service_args(ns, p)["tokenizer"]


def test_pacing_flags_reach_the_front_door_by_its_names() -> None:
    args = _tokenizer_args("--pacing-events-per-s", "8000", "--pacing-max-hold-ms", "30")
    assert args[args.index("--pacing-events-per-s") + 1] == "8000.0"
    assert args[args.index("--pacing-max-hold-ms") + 1] == "30.0"
    cfg = parse_config(TokenizerConfig, ["--scheduler-address", "x:1", *args])
    assert (cfg.pacing_events_per_s, cfg.pacing_max_hold_ms) == (8000.0, 30.0)


def test_pacing_flags_not_given_pass_nothing() -> None:
    args = _tokenizer_args()
    assert not [a for a in args if a.startswith("--pacing")]
    assert TokenizerConfig.pacing_events_per_s == 16000.0  # the front door's own default
