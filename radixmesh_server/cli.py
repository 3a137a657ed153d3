"""The `radixmesh` command: serve, generate, bench."""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from pathlib import Path

SMOKE_PROMPT = "What is the capital of France?"


def _serve(ns: argparse.Namespace) -> int:
    from radixmesh_server.launcher import Launcher, StackPorts, stack_specs
    from radixmesh_server.logging import configure_logging
    from radixmesh_server.model_store import ModelError, resolve_model

    configure_logging("launcher", ns.log_level)
    try:
        resolve_model(ns.model)  # convert/check once, before four processes race for it
    except ModelError as exc:
        print(f"radixmesh serve: {exc}", file=sys.stderr)
        return 2
    ports = StackPorts(ns.port, ns.port + 1, ns.port + 2, ns.port + 3)
    sched_args = ["--radix", ns.radix, "--policy", ns.policy]
    model_args = ["--kv-tokens", str(ns.kv_tokens)] if ns.kv_tokens else []
    m = ns.metrics_port
    metrics = StackPorts(m, m + 1, m + 2, m + 3) if m else None
    launcher = Launcher(
        stack_specs(
            ports, ns.model, model_args=model_args, scheduler_args=sched_args, metrics=metrics
        ),
        log_dir=Path(ns.log_dir) if ns.log_dir else None,
    )

    async def main() -> None:
        launcher.start_all()
        print(f"radixmesh: starting services (model {ns.model}) ...", flush=True)
        await launcher.wait_ready(timeout=ns.startup_timeout)
        print(
            f"radixmesh: ready. API at localhost:{ports.tokenizer} "
            f"(scheduler :{ports.scheduler}, model :{ports.model}, grammar :{ports.grammar})",
            flush=True,
        )
        if metrics is not None:
            print(f"radixmesh: /metrics on ports {m}-{m + 3} (same order)", flush=True)
        if not ns.no_smoke:
            await asyncio.to_thread(_smoke, f"localhost:{ports.tokenizer}")
        print("radixmesh: serving; Ctrl-C to stop.", flush=True)
        await launcher.supervise()

    try:
        asyncio.run(main())
    except KeyboardInterrupt:
        pass
    except (RuntimeError, TimeoutError) as exc:
        print(f"radixmesh serve: {exc}", file=sys.stderr)
        return 1
    finally:
        launcher.stop_all()
    return 0


def _smoke(endpoint: str) -> None:
    from radixmesh.api import Client

    with Client(endpoint) as c:
        res = c.generate(
            messages=[{"role": "user", "content": SMOKE_PROMPT}], max_new_tokens=24, temperature=0
        )
    print(f"radixmesh: smoke test\n  > {SMOKE_PROMPT}\n  < {res.text.strip()}", flush=True)


def _generate(ns: argparse.Namespace) -> int:
    from radixmesh.api import Client, GenerateResult, RadixMeshError

    kw: dict[str, object] = {"max_new_tokens": ns.max_new_tokens, "temperature": ns.temperature}
    if ns.seed is not None:
        kw["seed"] = ns.seed
    for name in ("json_schema", "regex", "ebnf"):
        if getattr(ns, name):
            kw[name] = getattr(ns, name)
    if ns.stop:
        kw["stop"] = ns.stop
    if ns.chat:
        kw["messages"] = [{"role": "user", "content": ns.prompt}]
    else:
        kw["prompt"] = ns.prompt
    try:
        with Client(ns.endpoint, timeout=ns.timeout) as c:
            result: GenerateResult | None = None
            for item in c.stream(**kw):  # type: ignore[arg-type]
                if isinstance(item, GenerateResult):
                    result = item
                elif not ns.json:
                    print(item.text, end="", flush=True)
    except RadixMeshError as exc:
        print(f"radixmesh generate: {exc}", file=sys.stderr)
        return 1
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


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="radixmesh", description=__doc__)
    sub = p.add_subparsers(dest="cmd", required=True)

    s = sub.add_parser("serve", help="start every service locally and wait")
    s.add_argument("--model", default="default", help="HF folder or 'default' (SmolLM2-135M)")
    s.add_argument("--port", type=int, default=50051, help="API port; services use the next 3")
    s.add_argument("--radix", default="tree", choices=["tree", "table", "off"])
    s.add_argument(
        "--policy", default="lpm", choices=["lpm", "dfs-weight", "fcfs", "lof", "random"]
    )
    s.add_argument("--kv-tokens", type=int, default=0, help="KV pool size (0: memory budget)")
    s.add_argument("--log-dir", default="", help="write each service's log here")
    s.add_argument(
        "--metrics-port",
        type=int,
        default=0,
        help="serve /metrics: the front door on this port, the others on the next 3 (0: off)",
    )
    s.add_argument("--log-level", default="info")
    s.add_argument("--startup-timeout", type=float, default=600.0)
    s.add_argument("--no-smoke", action="store_true", help="skip the start-up smoke request")
    s.set_defaults(func=_serve)

    g = sub.add_parser("generate", help="one request, streamed to the terminal")
    g.add_argument("prompt")
    g.add_argument("--endpoint", default="localhost:50051")
    g.add_argument("--chat", action="store_true", help="apply the model's chat template")
    g.add_argument("--max-new-tokens", type=int, default=128)
    g.add_argument("--temperature", type=float, default=0.0)
    g.add_argument("--seed", type=int, default=None)
    g.add_argument("--stop", action="append", default=[], help="stop string (repeatable)")
    g.add_argument("--json-schema", dest="json_schema", default=None)
    g.add_argument("--regex", default=None)
    g.add_argument("--ebnf", default=None)
    g.add_argument("--json", action="store_true", help="print the final result as JSON")
    g.add_argument("--timeout", type=float, default=None)
    g.set_defaults(func=_generate)

    from radixmesh_bench.cli import add_bench_parser

    add_bench_parser(sub)
    return p


def main(argv: list[str] | None = None) -> int:
    ns = build_parser().parse_args(argv)
    return int(ns.func(ns))


if __name__ == "__main__":
    sys.exit(main())
