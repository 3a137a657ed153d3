"""The `radixmesh` command: serve, generate, certs, bench.

Client commands stay light: this module imports only the standard library at the top (and
`serve`'s flags, services.cli_serve, which does the same), `generate` imports the gRPC client
alone (no torch, no xgrammar), and `bench` is a plug-in run as `python -m radixmesh_bench` in a
child process, never imported here (tests/unit/test_import_graph.py holds both).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import socket
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar, cast

# `serve`'s flags have their own module; its choice tables stay importable from here.
from services.cli_serve import HOST_TIER_WRITES as HOST_TIER_WRITES
from services.cli_serve import ROUTERS as ROUTERS
from services.cli_serve import add_serve, positive_int

if TYPE_CHECKING:
    from radixmesh.api import Client, GenerateResult, RadixMeshError

BENCH_MODULE = "radixmesh_bench"

SMOKE_PROMPT = "What is the capital of France?"
T = TypeVar("T")
EXIT_ERROR = 1  # the request failed, or nothing listens at --endpoint
EXIT_CUT = 3  # generate: constrained output cut by --max-new-tokens (incomplete)
EXIT_INTERRUPTED = 130  # 128 + SIGINT, what shells report for a Ctrl-C
API_KEY_ENV = "RADIXMESH_API_KEY"  # the client's key (radixmesh.api.Client reads it too)
GRAMMAR_FLAGS = ("json_schema", "regex", "ebnf")


def say(msg: str) -> None:
    print(f"radixmesh: {msg}", flush=True)


def with_heartbeat(
    label: str, fn: Callable[[], T], every: float = 5.0, say: Callable[[str], None] = say
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
    say(f"wrote {', '.join(roles)} certificates ({ns.days} days; {where})")
    print("load them (a new Secret, or --dry-run=client -o yaml | kubectl apply -f - to replace):")
    for role in roles:
        print(
            f"  kubectl -n {ns.namespace} create secret generic radixmesh-mtls-{role} "
            f"--type=kubernetes.io/tls --from-file={out / role}"
        )
    return 0


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
    for name in GRAMMAR_FLAGS:
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


def listen_problem(endpoint: str, timeout: float = 3.0) -> str | None:
    """Why nothing can answer at `endpoint` (host:port), or None. A refused TCP connect is
    known at once, where gRPC would retry for half a minute before UNAVAILABLE; other
    endpoint forms (dns:///, unix:) are left to gRPC."""
    host, sep, port = endpoint.rpartition(":")
    if not sep or "/" in endpoint or not port.isdigit():
        return None
    host = host.strip("[]") or "localhost"
    try:
        with socket.create_connection((host, int(port)), timeout=timeout):
            return None
    except OSError as exc:
        reason = exc.strerror or type(exc).__name__
    return (
        f"nothing answers at {endpoint} ({reason}): is `radixmesh serve` running? Start it "
        "(bash scripts/serve.sh, or radixmesh serve), or point --endpoint at its API port"
    )


def error_hint(exc: RadixMeshError) -> str:
    """What to do about a refused call, for the errors a person can fix from here."""
    import grpc

    if exc.code == grpc.StatusCode.UNAUTHENTICATED:
        return f" (pass --api-key KEY, or set {API_KEY_ENV}, to a key the server was started with)"
    if exc.code == grpc.StatusCode.UNAVAILABLE:
        return " (is `radixmesh serve` running, and --endpoint its API port?)"
    return ""


def _generate(ns: argparse.Namespace) -> int:
    problem = listen_problem(ns.endpoint)  # before gRPC is even imported: an instant answer
    if problem is not None:
        print(f"radixmesh generate: {problem}", file=sys.stderr)
        return EXIT_ERROR
    from radixmesh.api import Client, GenerateResult, RadixMeshError

    kw = generate_kwargs(ns)
    result: GenerateResult | None = None
    try:
        with Client(ns.endpoint, timeout=ns.timeout, api_key=ns.api_key) as c:
            try:
                for item in c.stream(**kw):
                    if isinstance(item, GenerateResult):
                        result = item
                    elif not ns.json:
                        print(item.text, end="", flush=True)
            except KeyboardInterrupt:
                return _interrupted(c, str(kw["request_id"]))
    except RadixMeshError as exc:
        print(f"radixmesh generate: {exc}{error_hint(exc)}", file=sys.stderr)
        return EXIT_ERROR
    except KeyboardInterrupt:  # while connecting or closing: nothing to abort
        return EXIT_INTERRUPTED
    assert result is not None
    if ns.json:
        print(json.dumps(result_json(result), indent=2))
    else:
        print()
    return check_cut(ns, result.finish_reason)


def result_json(result: GenerateResult) -> dict[str, Any]:
    return {
        "text": result.text,
        "finish_reason": result.finish_reason,
        "matched_stop": result.matched_stop,
        "prompt_tokens": result.prompt_tokens,
        "completion_tokens": result.completion_tokens,
        "cached_tokens": result.cached_tokens,
    }


def check_cut(ns: argparse.Namespace, finish_reason: str) -> int:
    """Output cut by the token limit under a grammar is unfinished (a JSON document without
    its closing brace): say so on stderr and exit EXIT_CUT, so that a script never takes it
    for a result. Without a grammar a cut is an ordinary ending."""
    constraint = next((f"--{n.replace('_', '-')}" for n in GRAMMAR_FLAGS if getattr(ns, n)), "")
    if finish_reason != "length" or not constraint:
        return 0
    print(
        f"radixmesh generate: warning: the output was cut at --max-new-tokens "
        f"{ns.max_new_tokens} before the {constraint} grammar finished, so it is incomplete "
        "(finish_reason length); raise --max-new-tokens",
        file=sys.stderr,
    )
    return EXIT_CUT


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

    add_serve(sub)

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
    g.add_argument(
        "--api-key",
        default=None,
        help=f"API key of a server started with keys (default: ${API_KEY_ENV})",
    )
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
