"""`radixmesh serve`: every service of a local stack as its own process, in this order:

1. the port plan: every port the stack will bind (each service's gRPC port, the front doors'
   HTTP ports, /metrics, health) checked in a second, each refusal naming the flag that moves
   that port, before anything slow;
2. the log folder made private (0700), then the model prepared (a conversion or a download);
3. the services started and watched (services.launcher), a smoke request, supervision until
   SIGTERM/Ctrl-C, which drains.

The smoke request is a courtesy: when it fails (for example refused by API keys it was not
given) the stack keeps serving and the reason is printed.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import sys
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from services.cli import EXIT_INTERRUPTED, SMOKE_PROMPT, say, with_heartbeat

if TYPE_CHECKING:
    from services.placement import Placement
    from services.topology import ServiceSpec, Topology

EXIT_PORTS = 1  # a port of the plan is taken or given twice
EXIT_SETUP = 2  # the model or the log folder cannot be used
# Where the front door reads API keys from the environment (services.config's prefix).
KEY_ENV = {
    "api_keys": "RADIXMESH_API_KEYS",
    "admin_api_keys": "RADIXMESH_ADMIN_API_KEYS",
    "api_keys_file": "RADIXMESH_API_KEYS_FILE",
}
# serve's front-door flags passed to every front door, when given (gpu_flags.given_args).
FRONT_DOOR_PASSED_ON = {
    "pacing_events_per_s": ("tokenizer", "--pacing-events-per-s"),
    "pacing_max_hold_ms": ("tokenizer", "--pacing-max-hold-ms"),
}


def _err(msg: str) -> None:
    print(f"radixmesh serve: {msg}", file=sys.stderr, flush=True)


def service_args(ns: argparse.Namespace, placement: Placement) -> dict[str, list[str]]:
    """Each kind's own flags from serve's flags; `--log-level`/`--log-format` go to all."""
    from services.gpu_flags import given_args, gpu_service_args

    logs = ["--log-level", ns.log_level, "--log-format", ns.log_format]
    tok = ["--served-model-name", ns.served_model_name] if ns.served_model_name else []
    if ns.chat_template:
        tok += ["--chat-template", str(Path(ns.chat_template).resolve())]
    # --kv-tokens is the stack's total: N replicas together hold what one would.
    per_replica = ns.kv_tokens // len(placement.replicas)
    model = ["--kv-tokens", str(per_replica)] if ns.kv_tokens else []
    # The host tier needs both ends: the model service's pool, the scheduler's index space.
    host = ["--host-kv-tokens", str(ns.host_kv_tokens)] if ns.host_kv_tokens else []
    write = ["--host-tier-write", ns.host_tier_write] if ns.host_kv_tokens else []
    gpu = gpu_service_args(ns)
    # only those given: the front door keeps its own defaults (one table)
    pacing = given_args(ns, FRONT_DOOR_PASSED_ON, ("tokenizer",))["tokenizer"]
    return {
        "model": [*model, *host, *placement.model_args(), *gpu["model"], *logs],
        "scheduler": [
            *["--radix", ns.radix, "--policy", ns.policy, *host, *write],
            *gpu["scheduler"],
            *logs,
        ],
        "tokenizer": [*tok, "--router", ns.router, *pacing, *logs],
        "grammar": logs,
    }


def key_env(ns: argparse.Namespace) -> dict[str, str]:
    """The API-key settings given as serve flags, for the front doors' environment: a key on
    a command line would be readable by every user of the machine (ps)."""
    return {env: getattr(ns, name) for name, env in KEY_ENV.items() if getattr(ns, name)}


def smoke_key(ns: argparse.Namespace, environ: Mapping[str, str]) -> str | None:
    """A key the smoke request may use when keys are configured (flags win over the
    environment, as in the services' own configuration); None: the API is open."""

    def setting(name: str) -> str:
        return str(getattr(ns, name) or environ.get(KEY_ENV[name], ""))

    for name in ("api_keys", "admin_api_keys"):
        keys = [k.strip() for k in setting(name).split(",") if k.strip()]
        if keys:
            return keys[0]
    path = setting("api_keys_file")
    if path:
        try:
            lines = Path(path).read_text().splitlines()
        except OSError:
            return None  # the front door reports the unreadable file itself
        for line in lines:
            words = line.split("#", 1)[0].split()
            if words:
                return words[0]
    return None


def build_specs(
    ns: argparse.Namespace, topo: Topology, model: str, placement: Placement | None = None
) -> list[ServiceSpec]:
    """`placement`: where each replica's ranks run (None: one rank per replica, no GPU
    pinning, as on the CPU)."""
    from services.placement import plan_placement
    from services.topology import sequential_ports, topology_specs

    if placement is None:  # the placement rule's own CPU case, not a hand-made copy of it
        placement = plan_placement([], replicas=topo.replicas)
    kinds = service_args(ns, placement)
    m = ns.metrics_port
    specs = topology_specs(
        topo,
        sequential_ports(ns.port, topo),
        model,
        http_port=ns.http_port,
        model_args=kinds["model"],
        scheduler_args=kinds["scheduler"],
        tokenizer_args=kinds["tokenizer"],
        grammar_args=kinds["grammar"],
        shutdown_grace=ns.shutdown_grace,
        metrics_port=sequential_ports(m, topo) if m else None,
    )
    for spec in specs:
        if spec.public:
            spec.env.update(key_env(ns))
    return specs


def check_plan(specs: list[ServiceSpec]) -> str | None:
    """The reason this stack cannot bind its ports, or None (a bind per port: quick)."""
    from services.ports import first_problem

    return first_problem(use for spec in specs for use in spec.port_uses())


def serve(ns: argparse.Namespace) -> int:
    from services.gpu_flags import plan, random_model_folder
    from services.log_tail import LogDirError, make_private_dir
    from services.logging import configure_logging
    from services.model_store import ModelError, describe_model_source, resolve_model
    from services.topology import Topology

    configure_logging("launcher", ns.log_level, json=ns.log_format == "json")
    try:
        placement = plan(ns)
    except ValueError as exc:
        _err(str(exc))
        return EXIT_SETUP
    say(f"placement: {placement.note}")
    topo = Topology(
        len(placement.replicas),
        ns.front_doors,
        ns.grammar_replicas,
        replica_env=placement.replica_envs(),
        shared_port=True,  # clients (SGLang's bench included) reach them all on one address
    )
    problem = check_plan(build_specs(ns, topo, ns.model, placement))
    if problem is not None:
        _err(problem)
        return EXIT_PORTS
    if ns.log_dir:
        try:
            make_private_dir(Path(ns.log_dir))
        except (LogDirError, OSError) as exc:
            _err(str(exc))
            return EXIT_SETUP
    if ns.random_weights:
        # The shape's folder (config.json, tokenizer) serves the front door and the grammar
        # service; the model service draws the weights itself.
        try:
            shape = Path(random_model_folder(ns.random_weights))
        except ValueError as exc:
            _err(str(exc))
            return EXIT_SETUP
        specs = build_specs(ns, topo, str(shape), placement)
        return _run(ns, topo, specs, f"{shape} (random weights)")
    say(f"preparing model {ns.model!r}: {describe_model_source(ns.model)}")
    try:
        # Convert/download once, before four processes race for it.
        folder = with_heartbeat("preparing the model", lambda: resolve_model(ns.model))
    except ModelError as exc:
        _err(str(exc))
        return EXIT_SETUP
    except KeyboardInterrupt:  # during a conversion or download: nothing started yet
        return EXIT_INTERRUPTED
    # Services get a local folder: a hub id is resolved (downloaded) here only.
    model = ns.model if ns.model in ("", "default") else str(folder)
    return _run(ns, topo, build_specs(ns, topo, model, placement), str(folder))


def _port_label(topo: Topology, name: str, port: int) -> str:
    """`scheduler :50052`; a front door on the shared address by its health-only port."""
    if topo.shares_port and name.startswith("tokenizer-"):
        return f"{name} health :{port}"
    return f"{name} :{port}"


def _run(ns: argparse.Namespace, topo: Topology, specs: list[ServiceSpec], folder: str) -> int:
    from services.drain import INTERNAL_EXTRA_S
    from services.launcher import Launcher

    launcher = Launcher(specs, log_dir=Path(ns.log_dir) if ns.log_dir else None, internal_tls=True)
    from services.topology import sequential_ports

    names = topo.names()
    port_of = sequential_ports(ns.port, topo)

    async def main() -> None:
        # SIGTERM/SIGINT: stop supervising; the finally below forwards SIGTERM to every
        # service, which drains (in-flight requests get --shutdown-grace seconds).
        task = asyncio.current_task()
        assert task is not None
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, task.cancel)
        launcher.start_all()
        say(f"starting services (model {folder}); logs in {launcher.log_dir}")
        await launcher.wait_ready(timeout=ns.startup_timeout, progress=_startup_progress)
        others = ", ".join(_port_label(topo, n, port_of(n)) for n in names[1:])
        api = f"API at localhost:{port_of(names[0])} ({others})"
        http = f"; HTTP at http://localhost:{ns.http_port} (OpenAI /v1, SGLang /generate, /metrics)"
        say(f"ready. {api}{http if ns.http_port else ''}")
        if ns.metrics_port:
            metrics_of = sequential_ports(ns.metrics_port, topo)
            served = ", ".join(f"{n} :{metrics_of(n)}" for n in names if topo.is_service(n))
            say(f"/metrics on {served}")
        if not ns.no_smoke:
            key = smoke_key(ns, os.environ)
            await _bounded_smoke(f"localhost:{port_of(names[0])}", key)
        say("serving; Ctrl-C to stop.")
        await launcher.supervise()

    code = 0
    try:
        asyncio.run(main())
    except (KeyboardInterrupt, asyncio.CancelledError):
        say("stopping; draining in-flight requests ...")
    except (RuntimeError, TimeoutError) as exc:
        _err(str(exc))
        code = 1
    finally:
        launcher.stop_all(grace=ns.shutdown_grace + INTERNAL_EXTRA_S + 5.0)
        if launcher.log_folder is not None:
            kept = f"logs kept in {launcher.log_dir}"
            say(kept if launcher.logs_kept else "logs removed (pass --log-dir DIR to keep them)")
    return code


def _startup_progress(event: str, pending: list[str], elapsed: float) -> None:
    if event.startswith("ready:"):
        say(f"{event.removeprefix('ready:')} ready ({elapsed:.1f} s)")
    elif pending:
        say(f"loading: {', '.join(pending)} ({elapsed:.0f} s)")


SMOKE_TIMEOUT_S = 120.0  # the smoke request's own deadline; serve waits at most 1.5x that


async def _smoke(endpoint: str, api_key: str | None, out: Callable[[str], None] = say) -> bool:
    """One chat request through the whole stack; a failure is reported, never fatal.

    It runs on the launcher's event loop with the asyncio client: the launcher's own gRPC
    calls are grpc.aio ones, and a blocking (sync-stack) call from a thread of the same process
    beside them could hang past its deadline (seen as a serve that answered its smoke request
    at the front door yet never printed it, under a loaded CI machine)."""
    from radixmesh.api import AsyncClient, RadixMeshError

    try:
        async with AsyncClient(endpoint, api_key=api_key, timeout=SMOKE_TIMEOUT_S) as c:
            res = await c.generate(
                messages=[{"role": "user", "content": SMOKE_PROMPT}],
                max_new_tokens=24,
                temperature=0,
            )
    except RadixMeshError as exc:
        _err(f"the smoke request failed ({exc}); the services keep serving")
        return False
    out(f"smoke test\n  > {SMOKE_PROMPT}\n  < {res.text.strip()}")
    return True


async def _bounded_smoke(endpoint: str, api_key: str | None) -> bool:
    """`_smoke`, and whatever happens to it serve goes on serving within 1.5x its deadline."""
    try:
        return await asyncio.wait_for(_smoke(endpoint, api_key), SMOKE_TIMEOUT_S * 1.5)
    except asyncio.TimeoutError:  # TimeoutError itself only from Python 3.11
        _err(
            f"the smoke request did not end within {SMOKE_TIMEOUT_S * 1.5:g} s; the services "
            "keep serving"
        )
        return False
