"""`radixmesh serve`'s flags: one argparse group per concern, added in the order `--help` lists
them (the GPU group's table lives in services.gpu_flags). Standard library only at import, as
services.cli: `radixmesh --help` must load nothing heavy (tests/unit/test_import_graph.py).
"""

from __future__ import annotations

import argparse
from typing import Any

from services.gpu_flags import add_gpu_flags

# The front door's --router choices (tokenizer_service/config.py; a unit test keeps them equal:
# this layer imports no service).
ROUTERS = ("cache_aware", "round_robin", "least_load")
HOST_TIER_WRITES = ("write_back", "write_through")  # the scheduler's (scheduler_service/config.py)


def positive_int(value: str) -> int:
    n = int(value)
    if n < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {n}")
    return n


def _serve(ns: argparse.Namespace) -> int:
    from services.serve_cmd import serve

    return serve(ns)


def add_serve(sub: Any) -> None:
    """`serve`'s flags, one argparse group per concern (new groups, such as GPU placement,
    go beside these)."""
    s = sub.add_parser("serve", help="start every service locally and wait")
    groups = (_model, _ports, _topology, _scheduling, add_gpu_flags, _keys, _logs, _life)
    for add_group in groups:
        add_group(s)
    s.set_defaults(func=_serve)


def _model(s: argparse.ArgumentParser) -> None:
    model = s.add_argument_group("model")
    model.add_argument(
        "--model",
        default="default",
        help="'default' (SmolLM2-135M), a local HF folder, or a hub id org/name",
    )
    model.add_argument("--served-model-name", default="", help="model name the HTTP APIs answer to")
    model.add_argument("--chat-template", default="", help="Jinja chat template file to serve with")


def _ports(s: argparse.ArgumentParser) -> None:
    ports = s.add_argument_group("ports (all checked before the model is prepared)")
    ports.add_argument(
        "--port",
        type=int,
        default=50051,
        help="gRPC API port; the internal services use the next ones (4 in all with one of "
        "each; more with --replicas, --grammar-replicas, --front-doors)",
    )
    ports.add_argument(
        "--http-port", type=int, default=8000, help="HTTP APIs' port, /metrics too (0: off)"
    )
    ports.add_argument(
        "--metrics-port",
        type=int,
        default=0,
        help="serve /metrics: the front door on this port, the others on the next ones, in the"
        " order of the API ports (0: off)",
    )


def _topology(s: argparse.ArgumentParser) -> None:
    topo = s.add_argument_group("topology")
    topo.add_argument(
        "--replicas",
        type=positive_int,
        default=None,
        help="scheduler+model pairs (each its own KV cache); default: one per visible GPU "
        "(or per --tp GPUs), 1 on the CPU",
    )
    topo.add_argument(
        "--front-doors",
        type=positive_int,
        default=1,
        help="front-door processes, all on --port and --http-port (SO_REUSEPORT)",
    )
    topo.add_argument(
        "--router",
        default="cache_aware",
        choices=ROUTERS,
        help="how front doors pick a replica: cache_aware (longest cached prefix unless "
        "overloaded), round_robin, least_load",
    )
    topo.add_argument(
        "--pacing-events-per-s",
        type=float,
        default=None,
        help="each front door's event budget: with many live streams, tokens gather into "
        "fewer events (default: the front door's, 16000; 0: off; docs/front_door.md)",
    )
    topo.add_argument(
        "--pacing-max-hold-ms",
        type=float,
        default=None,
        help="the longest the event budget holds a stream's tokens (default: the front door's, 60)",
    )
    topo.add_argument("--grammar-replicas", type=positive_int, default=1, help="grammar services")


def _scheduling(s: argparse.ArgumentParser) -> None:
    sched = s.add_argument_group("scheduling and cache")
    sched.add_argument("--radix", default="tree", choices=["tree", "table", "off"])
    sched.add_argument(
        "--policy", default="lpm", choices=["lpm", "dfs-weight", "fcfs", "lof", "random"]
    )
    sched.add_argument(
        "--kv-tokens",
        type=int,
        default=0,
        help="KV pool size of the whole stack, split evenly over the replicas (0: each model "
        "service's memory budget)",
    )
    sched.add_argument(
        "--host-kv-tokens",
        type=int,
        default=0,
        help="host-memory KV tier under the radix cache, per replica, in tokens (docs/radix.md, "
        "Host tier; 0: off)",
    )
    sched.add_argument(
        "--host-tier-write",
        default="write_back",
        choices=HOST_TIER_WRITES,
        help="when KV goes to the host tier: write_back (on GPU eviction) or write_through "
        "(as each request's KV enters the cache)",
    )


def _keys(s: argparse.ArgumentParser) -> None:
    keys = s.add_argument_group("API keys (docs/security.md; default: open)")
    keys.add_argument("--api-keys", default="", help="comma-separated API keys, a tenant each")
    keys.add_argument("--admin-api-keys", default="", help="keys that may also call GetStats")
    keys.add_argument("--api-keys-file", default="", help="`KEY [tenant=NAME] [admin]` a line")


def _logs(s: argparse.ArgumentParser) -> None:
    logs = s.add_argument_group("logs")
    logs.add_argument(
        "--log-dir",
        default="",
        help="write each service's log here, kept (made 0700); default: a temporary folder, "
        "removed when the stack stops cleanly",
    )
    logs.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])
    logs.add_argument(
        "--log-format",
        default="text",
        choices=["text", "json"],
        help="every service's log lines as key=value text or JSON",
    )


def _life(s: argparse.ArgumentParser) -> None:
    life = s.add_argument_group("start-up and shutdown")
    life.add_argument("--startup-timeout", type=float, default=600.0)
    life.add_argument("--no-smoke", action="store_true", help="skip the start-up smoke request")
    life.add_argument(
        "--shutdown-grace",
        type=float,
        default=30.0,
        help="on SIGTERM/Ctrl-C, seconds in-flight requests may take to finish before they end "
        "with UNAVAILABLE",
    )
