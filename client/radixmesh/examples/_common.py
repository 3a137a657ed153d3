"""Shared command line for the examples: `--endpoint HOST:PORT` (default: $RADIXMESH_ENDPOINT
or localhost:50051), or `--endpoint scripted` for an offline dry run on a scripted backend."""

from __future__ import annotations

import argparse

import radixmesh as rm
from radixmesh.lang.scripted import Responder


def parser(description: str) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=description)
    p.add_argument(
        "--endpoint",
        default=rm.default_endpoint(),
        help="RadixMesh front door, or 'scripted' for an offline dry run",
    )
    p.add_argument("--timeout", type=float, default=120.0, help="seconds per request")
    return p


def backend(args: argparse.Namespace, script: Responder | None = None) -> rm.Backend:
    """The backend the example runs on, also installed as the default backend."""
    chosen: rm.Backend
    if args.endpoint == "scripted":
        chosen = rm.ScriptedBackend(script or (lambda prompt, params: " (scripted reply)"))
    else:
        chosen = rm.RuntimeEndpoint(args.endpoint, timeout=args.timeout)
    rm.set_default_backend(chosen)
    return chosen


def report(state: rm.ProgramState) -> None:
    """Prints the program's radix-cache accounting."""
    stats = state.stats
    print(
        f"[{len(stats.requests)} requests, {stats.prompt_tokens()} prompt tokens, "
        f"{stats.cached_tokens()} cached ({stats.cache_hit_rate():.0%})]"
    )
