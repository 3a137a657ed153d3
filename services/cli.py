"""The `radixmesh` command: serve, generate, certs, bench.

Client commands stay light: this module imports only the standard library at the top, `generate`
imports the gRPC client alone (no torch, no xgrammar), and `bench` is a plug-in run as
`python -m radixmesh_bench` in a child process, never imported here (tests/unit/
test_import_graph.py holds both).
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import json
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar, cast

if TYPE_CHECKING:
    from radixmesh.api import Client

BENCH_MODULE = "radixmesh_bench"

SMOKE_PROMPT = "What is the capital of France?"
T = TypeVar("T")
EXIT_INTERRUPTED = 130  # 128 + SIGINT, what shells report for a Ctrl-C


def _say(msg: str) -> None:
    print(f"radixmesh: {msg}", flush=True)


def with_heartbeat(
    label: str, fn: Callable[[], T], every: float = 5.0, say: Callable[[str], None] = _say
) -> T:
    """Run fn() in a thread; say what it is doing and the elapsed seconds every few seconds
    (a model conversion or download is otherwise a long silent stretch)."""
    box: dict[str, Any] = {}

    def target() -> None:
        try:
            box["value"] = fn()
        except BaseException as exc:  # re-raised in the caller's thread
            box["error"] = exc

    t0 = time.monotonic()
    worker = threading.Thread(target=target, name=label, daemon=True)
    worker.start()
    worker.join(every)
    while worker.is_alive():
        say(f"{label} ... {time.monotonic() - t0:.0f} s")
        worker.join(every)
    if "error" in box:
        raise box["error"]
    return cast(T, box["value"])


def _startup_progress(event: str, pending: list[str], elapsed: float) -> None:
    if event.startswith("ready:"):
        _say(f"{event.removeprefix('ready:')} ready ({elapsed:.1f} s)")
    elif pending:
        _say(f"loading: {', '.join(pending)} ({elapsed:.0f} s)")


def _serve(ns: argparse.Namespace) -> int:
    from services.drain import INTERNAL_EXTRA_S
    from services.launcher import Launcher, Topology, sequential_ports, topology_specs
    from services.logging import configure_logging
    from services.model_store import ModelError, describe_model_source, resolve_model

    configure_logging("launcher", ns.log_level)
    _say(f"preparing model {ns.model!r}: {describe_model_source(ns.model)}")
    try:
        # Convert/download once, before four processes race for it.
        folder = with_heartbeat("preparing the model", lambda: resolve_model(ns.model))
    except ModelError as exc:
        print(f"radixmesh serve: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:  # during a conversion or download: nothing started yet
        return EXIT_INTERRUPTED
    # Services get a local folder: a hub id is resolved (downloaded) here only.
    model = ns.model if ns.model in ("", "default") else str(folder)
    topo = Topology(ns.replicas, ns.front_doors, ns.grammar_replicas)
    port_of = sequential_ports(ns.port, topo)
    tok_args = ["--served-model-name", ns.served_model_name] if ns.served_model_name else []
    if ns.chat_template:
        tok_args += ["--chat-template", str(Path(ns.chat_template).resolve())]
    sched_args = ["--radix", ns.radix, "--policy", ns.policy]
    # --kv-tokens is the stack's total: N replicas together hold what one would.
    per_replica = ns.kv_tokens // topo.replicas
    model_args = ["--kv-tokens", str(per_replica)] if ns.kv_tokens else []
    m = ns.metrics_port
    metrics_of = sequential_ports(m, topo) if m else None
    names = topo.names()
    launcher = Launcher(
        topology_specs(
            topo,
            port_of,
            model,
            http_port=ns.http_port,
            model_args=model_args,
            scheduler_args=sched_args,
            tokenizer_args=tok_args,
            shutdown_grace=ns.shutdown_grace,
            metrics_port=metrics_of,
        ),
        log_dir=Path(ns.log_dir) if ns.log_dir else None,
        internal_tls=True,
    )
    api_port = port_of(names[0])

    async def main() -> None:
        # SIGTERM/SIGINT: stop supervising; the finally below forwards SIGTERM to every
        # service, which drains (in-flight requests get --shutdown-grace seconds).
        task = asyncio.current_task()
        assert task is not None
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, task.cancel)
        launcher.start_all()
        _say(f"starting services (model {folder}); logs in {launcher.log_dir}")
        await launcher.wait_ready(timeout=ns.startup_timeout, progress=_startup_progress)
        others = ", ".join(f"{n} :{port_of(n)}" for n in names[1:])
        http = f"HTTP at http://localhost:{ns.http_port} (OpenAI /v1, SGLang /generate)"
        _say(f"ready. API at localhost:{api_port} ({others}); {http if ns.http_port else ''}")
        if metrics_of is not None:
            last = m + len(names) - 1
            print(f"radixmesh: /metrics on ports {m}-{last} (same order)", flush=True)
        if not ns.no_smoke:
            await asyncio.to_thread(_smoke, f"localhost:{api_port}")
        _say("serving; Ctrl-C to stop.")
        await launcher.supervise()

    try:
        asyncio.run(main())
    except (KeyboardInterrupt, asyncio.CancelledError):
        print("radixmesh: stopping; draining in-flight requests ...", flush=True)
    except (RuntimeError, TimeoutError) as exc:
        print(f"radixmesh serve: {exc}", file=sys.stderr)
        return 1
    finally:
        launcher.stop_all(grace=ns.shutdown_grace + INTERNAL_EXTRA_S + 5.0)
    return 0


def _smoke(endpoint: str) -> None:
    from radixmesh.api import Client

    with Client(endpoint) as c:
        res = c.generate(
            messages=[{"role": "user", "content": SMOKE_PROMPT}], max_new_tokens=24, temperature=0
        )
    print(f"radixmesh: smoke test\n  > {SMOKE_PROMPT}\n  < {res.text.strip()}", flush=True)


def _certs(ns: argparse.Namespace) -> int:
    """Files for the cluster's internal mTLS Secrets: one folder per role (see
    services.pki.write_role_folders), then the kubectl lines that load them."""
    from services.pki import CA_KEY_FILE, load_ca, write_role_folders

    out = Path(ns.out)
    roles = [r.strip() for r in ns.roles.split(",") if r.strip()]
    try:
        ca = None
        if ns.ca_dir:
            ca_dir = Path(ns.ca_dir)
            ca = load_ca(ca_dir / "ca.crt", ca_dir / CA_KEY_FILE)
        extra = b"".join(Path(t).read_bytes() for t in ns.trust)
        write_role_folders(out, roles, days=ns.days, ca=ca, extra_trust=extra)
    except (OSError, ValueError) as exc:
        print(f"radixmesh certs: {exc}", file=sys.stderr)
        return 2
    where = (
        f"CA from {ns.ca_dir}"
        if ns.ca_dir
        else f"new CA in {out / 'ca'} (keep ca.key out of the cluster)"
    )
    _say(f"wrote {', '.join(roles)} certificates ({ns.days} days; {where})")
    print("load them (a new Secret, or --dry-run=client -o yaml | kubectl apply -f - to replace):")
    for role in roles:
        print(
            f"  kubectl -n {ns.namespace} create secret generic radixmesh-mtls-{role} "
            f"--type=kubernetes.io/tls --from-file={out / role}"
        )
    return 0


def positive_int(value: str) -> int:
    n = int(value)
    if n < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {n}")
    return n


def schema_arg(value: str) -> str:
    """`--json-schema`: the schema's JSON text, `@FILE`, or the path of a file holding it."""
    path = Path(value[1:] if value.startswith("@") else value)
    if value.startswith("@") or (not value.lstrip().startswith("{") and path.is_file()):
        try:
            text = path.read_text()
        except OSError as exc:
            raise argparse.ArgumentTypeError(
                f"cannot read schema file {str(path)!r}: {exc}"
            ) from None
    else:
        text = value
    try:
        json.loads(text)
    except json.JSONDecodeError as exc:
        where = f"schema file {str(path)!r}" if text is not value else "the schema"
        raise argparse.ArgumentTypeError(f"{where} is not valid JSON: {exc}") from None
    return text


def generate_kwargs(ns: argparse.Namespace) -> dict[str, Any]:
    kw: dict[str, Any] = {"max_new_tokens": ns.max_new_tokens, "temperature": ns.temperature}
    if ns.seed is not None:
        kw["seed"] = ns.seed
    for name in ("json_schema", "regex", "ebnf"):
        if getattr(ns, name) is not None:
            kw[name] = getattr(ns, name)
    if ns.stop:
        kw["stop"] = ns.stop
    if ns.chat:
        kw["messages"] = [{"role": "user", "content": ns.prompt}]
    else:
        kw["prompt"] = ns.prompt
    kw["request_id"] = uuid.uuid4().hex  # ours, so that Ctrl-C can abort it by name
    return kw


def _generate(ns: argparse.Namespace) -> int:
    from radixmesh.api import Client, GenerateResult, RadixMeshError

    kw = generate_kwargs(ns)
    result: GenerateResult | None = None
    try:
        with Client(ns.endpoint, timeout=ns.timeout) as c:
            try:
                for item in c.stream(**kw):
                    if isinstance(item, GenerateResult):
                        result = item
                    elif not ns.json:
                        print(item.text, end="", flush=True)
            except KeyboardInterrupt:
                return _interrupted(c, str(kw["request_id"]))
    except RadixMeshError as exc:
        print(f"radixmesh generate: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:  # while connecting or closing: nothing to abort
        return EXIT_INTERRUPTED
    assert result is not None
    if ns.json:
        print(
            json.dumps(
                {
                    "text": result.text,
                    "finish_reason": result.finish_reason,
                    "matched_stop": result.matched_stop,
                    "prompt_tokens": result.prompt_tokens,
                    "completion_tokens": result.completion_tokens,
                    "cached_tokens": result.cached_tokens,
                },
                indent=2,
            )
        )
    else:
        print()
    return 0


def _interrupted(client: Client, request_id: str) -> int:
    """Ctrl-C mid-stream: abort the request on the server (closing the stream would cancel it
    too; the abort makes it explicit and immediate), then exit 130 without a traceback."""
    from radixmesh.api import RadixMeshError

    note = "aborted"
    try:
        if not client.abort(request_id, timeout=2.0):
            note = "already finished"
    except (RadixMeshError, KeyboardInterrupt):
        note = "abort not confirmed"
    print(f"\nradixmesh generate: interrupted; request {request_id} {note}", file=sys.stderr)
    return EXIT_INTERRUPTED


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="radixmesh", description="RadixMesh: serve, generate, bench.")
    sub = p.add_subparsers(dest="cmd", required=True)

    s = sub.add_parser("serve", help="start every service locally and wait")
    s.add_argument(
        "--model",
        default="default",
        help="'default' (SmolLM2-135M), a local HF folder, or a hub id org/name",
    )
    s.add_argument(
        "--port", type=int, default=50051, help="API port; the other services use the next ones"
    )
    s.add_argument("--http-port", type=int, default=8000, help="HTTP APIs' port (0: off)")
    s.add_argument("--served-model-name", default="", help="model name the HTTP APIs answer to")
    s.add_argument("--chat-template", default="", help="Jinja chat template file to serve with")
    s.add_argument("--radix", default="tree", choices=["tree", "table", "off"])
    s.add_argument(
        "--policy", default="lpm", choices=["lpm", "dfs-weight", "fcfs", "lof", "random"]
    )
    s.add_argument(
        "--kv-tokens",
        type=int,
        default=0,
        help="KV pool size of the whole stack, split evenly over the replicas (0: each model "
        "service's memory budget)",
    )
    s.add_argument(
        "--replicas",
        type=positive_int,
        default=1,
        help="scheduler+model pairs (each its own KV cache)",
    )
    s.add_argument(
        "--front-doors", type=positive_int, default=1, help="front doors (HTTP ports count up)"
    )
    s.add_argument("--grammar-replicas", type=positive_int, default=1, help="grammar services")
    s.add_argument("--log-dir", default="", help="write each service's log here")
    s.add_argument(
        "--metrics-port",
        type=int,
        default=0,
        help="serve /metrics: the front door on this port, the others on the next ones, in the"
        " order of the API ports (0: off)",
    )
    s.add_argument("--log-level", default="info")
    s.add_argument("--startup-timeout", type=float, default=600.0)
    s.add_argument("--no-smoke", action="store_true", help="skip the start-up smoke request")
    s.add_argument(
        "--shutdown-grace",
        type=float,
        default=30.0,
        help="on SIGTERM/Ctrl-C, seconds in-flight requests may take to finish before they end "
        "with UNAVAILABLE",
    )
    s.set_defaults(func=_serve)

    g = sub.add_parser("generate", help="one request, streamed to the terminal")
    g.add_argument("prompt")
    g.add_argument("--endpoint", default="localhost:50051")
    g.add_argument("--chat", action="store_true", help="apply the model's chat template")
    g.add_argument("--max-new-tokens", type=int, default=128)
    g.add_argument("--temperature", type=float, default=0.0)
    g.add_argument("--seed", type=int, default=None)
    g.add_argument("--stop", action="append", default=[], help="stop string (repeatable)")
    grammar = g.add_mutually_exclusive_group()  # one constraint per request
    grammar.add_argument(
        "--json-schema",
        dest="json_schema",
        type=schema_arg,
        default=None,
        help="constrain the output to this JSON schema: its text, @FILE or a file path",
    )
    grammar.add_argument("--regex", default=None, help="constrain the output to this regex")
    grammar.add_argument("--ebnf", default=None, help="constrain the output to this EBNF grammar")
    g.add_argument(
        "--json",
        action="store_true",
        help="print the result as a JSON object (output format; JSON mode is --json-schema)",
    )
    g.add_argument("--timeout", type=float, default=None)
    g.set_defaults(func=_generate)

    c = sub.add_parser(
        "certs", help="make the internal mTLS certificates of a cluster (one folder per role)"
    )
    c.add_argument("--out", required=True, help="folder to write (its files must not exist yet)")
    c.add_argument(
        "--roles",
        default="tokenizer,scheduler,model,grammar",
        help="comma-separated roles, one certificate each (common name = role)",
    )
    c.add_argument("--days", type=positive_int, default=365, help="validity of each certificate")
    c.add_argument(
        "--ca-dir",
        default="",
        help="sign with this existing CA (a folder holding ca.crt and ca.key, e.g. OUT/ca of an "
        "earlier run) instead of making a new one: renewals keep every peer's trust",
    )
    c.add_argument(
        "--trust",
        action="append",
        default=[],
        help="also trust this CA certificate (PEM; repeatable): a CA rotation's overlap",
    )
    c.add_argument("--namespace", default="radixmesh", help="namespace in the printed commands")
    c.set_defaults(func=_certs)

    # Listed for --help only: main() forwards `bench ...` before parsing.
    sub.add_parser("bench", help="benchmarks with JSON output (`radixmesh bench --help`)")
    return p


def _forward_bench(args: list[str]) -> int:
    """Run the benchmark plug-in in a child process: its imports (torch, xgrammar) never load
    into this one. Ctrl-C reaches the child through the terminal's process group."""
    if importlib.util.find_spec(BENCH_MODULE) is None:
        print(
            f"radixmesh bench: the benchmarks ({BENCH_MODULE}) are not installed; "
            "install the repository (`pip install -e .`) to run them",
            file=sys.stderr,
        )
        return 2
    proc = subprocess.Popen([sys.executable, "-m", BENCH_MODULE, *args])
    while True:
        try:
            return proc.wait()
        except KeyboardInterrupt:
            continue  # the child got the same SIGINT; its exit code is the answer


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else list(argv)
    if args[:1] == ["bench"]:
        return _forward_bench(args[1:])
    ns = build_parser().parse_args(args)
    return int(ns.func(ns))


if __name__ == "__main__":
    sys.exit(main())
