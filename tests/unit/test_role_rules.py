"""Every internal gRPC method checks its caller's role, and docs/security.md's table says which
(issue 26 item 5: Scheduler.FlushCache checked none, and a `client` certificate flushed the
whole cache).

The servers' rules are read from their code: each handler's `require_peer(context, "role", ...)`
call. The test fails when a method of a service (from the proto descriptors) has no such call,
when the table lacks a row or names other roles, and, for FlushCache, when a wrong role is not
refused at run time.
"""

from __future__ import annotations

import ast
import asyncio
import re
from pathlib import Path
from typing import Any

import grpc
import pytest

from radixmesh_wire.pb import grammar_pb2, model_pb2, scheduler_pb2
from services import security

ROOT = Path(__file__).resolve().parents[2]

# service name in the proto -> (its descriptor, the file and class that serve it)
SERVERS = {
    "Scheduler": (
        scheduler_pb2.DESCRIPTOR.services_by_name["Scheduler"],
        "scheduler_service/links/frontend.py",
        "SchedulerServicer",
    ),
    "ModelWorker": (
        model_pb2.DESCRIPTOR.services_by_name["ModelWorker"],
        "model_service/server.py",
        "ModelWorkerServicer",
    ),
    "Grammar": (
        grammar_pb2.DESCRIPTOR.services_by_name["Grammar"],
        "grammar_service/server.py",
        "GrammarServicer",
    ),
}


def _code_rules(path: str, cls: str) -> dict[str, frozenset[str]]:
    """Method name -> the roles its `require_peer` call admits (one call per handler)."""
    tree = ast.parse((ROOT / path).read_text())
    (klass,) = [n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == cls]
    rules: dict[str, frozenset[str]] = {}
    for fn in klass.body:
        if not isinstance(fn, ast.AsyncFunctionDef | ast.FunctionDef):
            continue
        calls = [
            c
            for c in ast.walk(fn)
            if isinstance(c, ast.Call)
            and isinstance(c.func, ast.Name)
            and c.func.id == "require_peer"
        ]
        if not calls:
            continue
        assert len(calls) == 1, f"{cls}.{fn.name}: one role rule per method"
        roles = [ast.literal_eval(a) for a in calls[0].args[1:]]
        assert roles and all(isinstance(r, str) for r in roles), f"{cls}.{fn.name}: literal roles"
        rules[fn.name] = frozenset(roles)
    return rules


def _doc_rules() -> dict[tuple[str, str], frozenset[str]]:
    """(service, method) -> roles, from the table under "## Internal links"."""
    text = (ROOT / "docs/security.md").read_text()
    section = text.split("## Internal links", 1)[1].split("\n## ", 1)[0]
    rows: dict[tuple[str, str], frozenset[str]] = {}
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) < 3 or cells[0] not in SERVERS:
            continue
        method = cells[1].strip("`")
        assert (cells[0], method) not in rows, f"{cells[0]}.{method} listed twice"
        rows[cells[0], method] = frozenset(re.findall(r"`([a-z][a-z0-9-]*)`", cells[2]))
    return rows


@pytest.mark.parametrize("service", sorted(SERVERS))
def test_every_method_has_a_role_rule(service: str) -> None:
    desc, path, cls = SERVERS[service]
    methods = {m.name for m in desc.methods}
    rules = _code_rules(path, cls)
    missing = methods - set(rules)
    assert not missing, f"{service} methods without require_peer: {sorted(missing)}"


def test_the_docs_table_is_the_servers_rules() -> None:
    code = {
        (service, method): roles
        for service, (_, path, cls) in SERVERS.items()
        for method, roles in _code_rules(path, cls).items()
    }
    doc = _doc_rules()
    assert doc == code
    # every role named is one a deployment issues certificates for
    from services.pki import SERVICE_ROLES

    assert set().union(*doc.values()) <= set(SERVICE_ROLES)


class _Refused(Exception):
    pass


class _Context:
    """A servicer context whose caller presents a certificate naming `role`."""

    def __init__(self, role: str) -> None:
        self.role = role
        self.code: grpc.StatusCode | None = None
        self.details = ""

    def auth_context(self) -> dict[str, list[bytes]]:
        return {"x509_common_name": [self.role.encode()]}

    async def abort(self, code: grpc.StatusCode, details: str) -> None:
        self.code, self.details = code, details
        raise _Refused(details)


def test_flush_cache_refuses_a_client_certificate(monkeypatch: Any) -> None:
    from scheduler_service.config import SchedulerConfig
    from scheduler_service.links.frontend import SchedulerServicer
    from scheduler_service.scheduler import Scheduler

    # Internal TLS on: identities are checked (the value itself is not read by require_peer).
    monkeypatch.setattr(security, "_internal", object())
    servicer = SchedulerServicer(Scheduler(SchedulerConfig()))

    async def call(role: str) -> tuple[grpc.StatusCode | None, Any]:
        ctx = _Context(role)
        try:
            reply = await servicer.FlushCache(scheduler_pb2.FlushCacheRequest(), ctx)  # type: ignore[arg-type]
        except _Refused:
            return ctx.code, None
        return ctx.code, reply

    code, reply = asyncio.run(call("client"))
    assert code == grpc.StatusCode.PERMISSION_DENIED and reply is None
    code, reply = asyncio.run(call("tokenizer"))
    assert code is None and not reply.flushed  # admitted; nothing started to flush yet
    assert "not started" in reply.message
