"""Run the cpu overlay's manifests, not a copy of them: every container of every rendered
Deployment starts as a local process with its own command, args and env; Service names map to
127.0.0.1 (a `dns:///name:port` spec keeps its scheme: the loopback address resolves like a
headless Service with one pod), every declared port to a free local port (consistently, so two
pods declaring one port cannot collide here), and every Secret mount to a local folder holding
what the real Secret would: certificates made by `radixmesh certs` (internal mutual TLS on) and
an API keys file. Each container is then probed exactly as its gRPC probes say (grpc.health.v1
with the declared service name, within the probe's own period x threshold), its metrics port is
scraped, and real generate requests go through the front door's Service port with an API key.
One stack start for the whole module."""

from __future__ import annotations

import json
import os
import re
import secrets as secrets_mod
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from radixmesh.api import Chunk, Client, GenerateResult, RadixMeshError

from services.config import ENV_PREFIX
from services.launcher import PARENT_ENV, free_port
from services.pki import SERVICE_ROLES
from tests.deploy.manifests import (
    Container,
    containers,
    of_kind,
    parsed_config,
    render,
    secret_mounts,
)

pytestmark = pytest.mark.integration

PROBES = ("startupProbe", "livenessProbe", "readinessProbe")  # the kubelet's order


@dataclass
class Local:
    """One container as a local process."""

    c: Container
    argv: list[str]
    env: dict[str, str]
    proc: subprocess.Popen[bytes] | None = None
    log: Path | None = None


class PortMap:
    """Manifest port -> free local port, one mapping for the whole overlay."""

    def __init__(self) -> None:
        self.ports: dict[int, int] = {}

    def __call__(self, port: int) -> int:
        if port not in self.ports:
            self.ports[port] = free_port()
        return self.ports[port]


def _service_targets(objs: tuple[dict[str, Any], ...]) -> dict[tuple[str, int], int]:
    """(Service name, Service port) -> the container port it forwards to."""
    out: dict[tuple[str, int], int] = {}
    deps = of_kind(objs, "Deployment")
    for svc in of_kind(objs, "Service"):
        sel = svc["spec"]["selector"]
        for sp in svc["spec"]["ports"]:
            target = sp.get("targetPort", sp["port"])
            for d in deps:
                labels = d["spec"]["template"]["metadata"]["labels"]
                if any(labels.get(k) != v for k, v in sel.items()):
                    continue
                for ctr in d["spec"]["template"]["spec"]["containers"]:
                    for cp in ctr.get("ports", []):
                        if target in (cp.get("name"), cp["containerPort"]):
                            out[(svc["metadata"]["name"], sp["port"])] = cp["containerPort"]
    return out


def localize(
    objs: tuple[dict[str, Any], ...], pm: PortMap, secrets: dict[str, Path]
) -> list[Local]:
    """Each long-running container's argv and env with addresses made local: a Service name
    resolves to 127.0.0.1 and its target port, loopback stays loopback, 0.0.0.0 binds
    127.0.0.1, every *_PORT value and host:port goes through the same port map, and a path
    inside a Secret mount points into that Secret's local folder (`secrets`: name -> folder)."""
    targets = _service_targets(objs)
    services = {name for name, _ in targets}

    def addr(m: re.Match[str]) -> str:
        scheme, host, port = m.group(1) or "", m.group(2), int(m.group(3))
        if host in services:
            assert (host, port) in targets, f"{host}:{port} is no port of Service {host}"
            return f"{scheme}127.0.0.1:{pm(targets[(host, port)])}"
        assert host in ("127.0.0.1", "localhost"), f"unknown host {host!r}"
        return f"{scheme}127.0.0.1:{pm(port)}"

    def value(name: str, v: str, mounts: dict[str, str]) -> str:
        if v == "0.0.0.0":
            return "127.0.0.1"
        if name.endswith("_PORT") and v.isdigit():
            return str(pm(int(v)))
        for mount, secret in mounts.items():
            if v.startswith(mount.rstrip("/") + "/"):
                assert secret in secrets, f"no local material for Secret {secret}"
                return str(secrets[secret] / v[len(mount.rstrip("/")) + 1 :])
        return re.sub(r"^(dns:///)?([a-z0-9.-]+):(\d+)$", addr, v)

    # The test's own RADIXMESH_* settings must not leak into the services.
    base = {k: v for k, v in os.environ.items() if not k.startswith(ENV_PREFIX)}
    base[PARENT_ENV] = str(os.getpid())  # services exit if this test process dies
    out = []
    for c in containers(objs):
        if c.init or c.workload["kind"] != "Deployment":
            continue
        cmd = list(c.spec["command"])
        assert cmd[0] == "python", c.where
        mounts = secret_mounts(c)
        args = [value("", a, mounts) for a in c.spec.get("args", [])]
        argv = [sys.executable, *cmd[1:], *args]
        env = {**base, **{k: value(k, v, mounts) for k, v in c.env().items()}}
        out.append(Local(c, argv, env))
    return out


def probe_once(port: int, service: str) -> bool:
    with grpc.insecure_channel(f"127.0.0.1:{port}") as chan:
        try:
            resp = health_pb2_grpc.HealthStub(chan).Check(
                health_pb2.HealthCheckRequest(service=service), timeout=2
            )
        except grpc.RpcError:
            return False
    return bool(resp.status == health_pb2.HealthCheckResponse.SERVING)


def wait_probe(loc: Local, kind: str, pm: PortMap) -> None:
    """Polls the probe at its period until it passes, failing where the kubelet would give
    up (period x failureThreshold) or when the process exits."""
    p = loc.c.spec[kind]
    grpc_probe = p["grpc"]
    port = pm(grpc_probe["port"])
    budget = p.get("periodSeconds", 10) * p.get("failureThreshold", 3)
    period = min(p.get("periodSeconds", 10), 1.0)  # poll faster; the budget is the kubelet's
    deadline = time.monotonic() + budget
    while not probe_once(port, grpc_probe["service"]):
        assert loc.proc is not None
        code = loc.proc.poll()
        assert code is None, (
            f"{loc.c.where} exited with {code} before its {kind} passed: {_tail(loc)}"
        )
        assert time.monotonic() < deadline, f"{loc.c.where}: {kind} never passed in {budget}s"
        time.sleep(period)


def _event(loc: Local, event: str) -> dict[str, Any]:
    """The first JSON log line of `event` in the container's log ({} if none)."""
    assert loc.log is not None
    for line in loc.log.read_text().splitlines():
        if line.startswith("{"):
            rec = json.loads(line)
            if rec.get("event") == event:
                return dict(rec)
    return {}


def _tail(loc: Local) -> str:
    return loc.log.read_text()[-3000:] if loc.log and loc.log.exists() else ""


API_KEY = "deploy-test-" + secrets_mod.token_hex(16)


def make_secrets(root: Path) -> dict[str, Path]:
    """What an operator puts into the Secrets (deploy/README.md, "Secrets"): the certificates
    from the real `radixmesh certs` command, one folder per role, and an API keys file."""
    certs = root / "certs"
    subprocess.run(
        [sys.executable, "-m", "services.cli", "certs", "--out", str(certs), "--days", "1"],
        check=True,
        capture_output=True,
        timeout=60,
    )
    out = {f"radixmesh-mtls-{role}": certs / role for role in SERVICE_ROLES}
    keys = root / "api-keys"
    keys.mkdir(mode=0o700)
    (keys / "api-keys").write_text(f"# tenant of the test\n{API_KEY} tenant=deploy-test\n")
    out["radixmesh-api-keys"] = keys
    return out


@pytest.fixture(scope="module")
def manifest_stack(
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[tuple[list[Local], PortMap, dict]]:
    objs = render("cpu")
    pm = PortMap()
    locals_ = localize(objs, pm, make_secrets(tmp_path_factory.mktemp("secrets")))
    logs = tmp_path_factory.mktemp("manifest-run")
    try:
        for loc in locals_:
            loc.log = logs / f"{loc.c.spec['name']}.log"
            with loc.log.open("wb") as f:
                loc.proc = subprocess.Popen(
                    loc.argv, env=loc.env, stdout=f, stderr=f, start_new_session=True
                )
        yield locals_, pm, _service_targets(objs)
    finally:
        for loc in locals_:
            if loc.proc is not None and loc.proc.poll() is None:
                loc.proc.send_signal(signal.SIGTERM)
        for loc in locals_:
            if loc.proc is None:
                continue
            try:
                loc.proc.wait(15)
            except subprocess.TimeoutExpired:
                loc.proc.kill()
                loc.proc.wait()


def test_containers_pass_their_probes_and_serve_a_request(
    manifest_stack: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    locals_, pm, targets = manifest_stack
    assert {loc.c.spec["name"] for loc in locals_} == {"frontdoor", "scheduler", "model", "grammar"}
    for kind in PROBES:
        for loc in locals_:
            wait_probe(loc, kind, pm)

    # Internal mutual TLS is on: a service port refuses a peer without a certificate (the
    # probes above passed on the plaintext health ports).
    for loc in locals_:
        if loc.c.spec["name"] != "frontdoor":
            port = pm(parsed_config(loc.c).port)
            assert not probe_once(port, "liveness"), f"{loc.c.where} spoke plaintext"
    for loc in locals_:
        assert _event(loc, "internal_links").get("mtls") is True, loc.c.where

    endpoint = f"127.0.0.1:{pm(targets[('radixmesh-frontdoor', 50051)])}"
    monkeypatch.delenv("RADIXMESH_API_KEY", raising=False)
    with Client(endpoint) as anonymous, pytest.raises(RadixMeshError) as refused:
        anonymous.generate("The capital of France is", max_new_tokens=1)
    assert refused.value.code == grpc.StatusCode.UNAUTHENTICATED
    assert "missing or unknown API key" in str(refused.value)
    with Client(endpoint, api_key=API_KEY) as c:
        plain = c.generate(
            "The capital of France is", max_new_tokens=4, temperature=0, ignore_eos=True
        )
        parts = list(
            c.stream("The capital of France is", max_new_tokens=4, temperature=0, ignore_eos=True)
        )
    assert plain.finish_reason == "length" and len(plain.output_ids) == 4
    final = parts[-1]
    assert isinstance(final, GenerateResult) and final.output_ids == plain.output_ids
    assert "".join(p.text for p in parts if isinstance(p, Chunk)) == plain.text

    # The HTTP API on the Service's http port: the same key, the same greedy tokens.
    http = f"http://127.0.0.1:{pm(targets[('radixmesh-frontdoor', 8000)])}"
    body = {"prompt": "The capital of France is", "max_tokens": 4, "temperature": 0}
    assert _post(f"{http}/v1/completions", body, None)[0] == 401
    status, reply = _post(f"{http}/v1/completions", body, API_KEY)
    assert status == 200, reply
    assert reply["choices"][0]["text"] == plain.text

    # Every container's metrics port (as declared) serves Prometheus text; the front door
    # counted the three calls (two gRPC, one HTTP; refused ones never reached it).
    for loc in locals_:
        port = next(p["containerPort"] for p in loc.c.spec["ports"] if "metrics" in p["name"])
        with urllib.request.urlopen(f"http://127.0.0.1:{pm(port)}/metrics", timeout=5) as r:
            text = r.read().decode()
        assert "# TYPE radixmesh_" in text, loc.c.where
        if loc.c.spec["name"] == "frontdoor":
            assert re.search(r"^radixmesh_num_requests_total 3\.0$", text, re.M), text[:2000]

    # JSON logs with the service name on every line, and the request id on the call's lines.
    front = next(loc for loc in locals_ if loc.c.spec["name"] == "frontdoor")
    assert '"service": "tokenizer"' in _tail(front)


def _post(url: str, body: dict[str, Any], key: str | None) -> tuple[int, dict[str, Any]]:
    headers = {"Content-Type": "application/json"}
    if key:
        headers["Authorization"] = f"Bearer {key}"
    req = urllib.request.Request(url, json.dumps(body).encode(), headers, method="POST")
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read() or b"{}")


def _exits_within_its_grace_period(loc: Local, t0: float) -> None:
    assert loc.proc is not None
    period = loc.c.pod["terminationGracePeriodSeconds"]
    code = loc.proc.wait(max(period - (time.monotonic() - t0), 0.1))
    assert code == 0, f"{loc.c.where} exited with {code}: {_tail(loc)}"


def test_sigterm_drains_and_exits(manifest_stack: Any) -> None:
    """What Kubernetes does to the pods: a front door's rolling update SIGTERMs it alone (it
    exits within terminationGracePeriodSeconds while the replica stays ready), then deleting
    the stack SIGTERMs every pod at once and the drain cascades (each internal session ends
    when its caller leaves), so every process exits 0 within its own period."""
    locals_, pm, _ = manifest_stack
    for loc in locals_:
        assert loc.proc is not None and loc.proc.poll() is None, loc.c.where
    front = next(loc for loc in locals_ if loc.c.spec["name"] == "frontdoor")
    assert front.proc is not None
    front.proc.send_signal(signal.SIGTERM)
    _exits_within_its_grace_period(front, time.monotonic())
    scheduler = next(loc for loc in locals_ if loc.c.spec["name"] == "scheduler")
    wait_probe(scheduler, "readinessProbe", pm)  # still serving: it lost a caller, not a peer

    rest = [loc for loc in locals_ if loc is not front]
    t0 = time.monotonic()
    for loc in rest:
        assert loc.proc is not None
        loc.proc.send_signal(signal.SIGTERM)
    for loc in rest:
        _exits_within_its_grace_period(loc, t0)
