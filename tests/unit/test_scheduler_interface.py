"""The links speak to the scheduler only through its interface (issue 25, "the scheduler's
face": the front-door servicer read eight of the scheduler's internals and evicted from its
cache directly).

Read from the code (AST) of every module under scheduler_service/links/:
- none imports the scheduler, its state, its cache, its planner or its sessions' internals;
- none reads a private attribute (`x._name`) of anything but itself;
- the servicer holds the scheduler as a `SchedulerInterface` and uses on it only that
  protocol's methods, never hands it on (so nothing reaches `st`, `cache`, `sinks`, ...).
And the Scheduler provides every method of the protocol.
"""

from __future__ import annotations

import ast
import inspect
from pathlib import Path

from scheduler_service.interface import SchedulerInterface
from scheduler_service.scheduler import Scheduler

ROOT = Path(__file__).resolve().parents[2]
LINKS = sorted((ROOT / "scheduler_service/links").glob("*.py"))
FORBIDDEN_IMPORTS = (
    "scheduler_service.scheduler",
    "scheduler_service.state",
    "scheduler_service.cache",
    "scheduler_service.planner",
    "scheduler_service.sessions.output",
    "scheduler_service.startup_hold",
)
PROTOCOL = {
    name
    for name, _ in inspect.getmembers(SchedulerInterface, inspect.isfunction)
    if not name.startswith("_")
}


def _tree(path: Path) -> ast.Module:
    return ast.parse(path.read_text(), filename=str(path))


def _is_self_sched(node: ast.AST) -> bool:
    return (
        isinstance(node, ast.Attribute)
        and node.attr == "sched"
        and isinstance(node.value, ast.Name)
        and node.value.id == "self"
    )


def test_the_protocol_is_what_the_scheduler_offers() -> None:
    assert {"open_session", "submit", "abort", "flush_cache", "snapshot"} <= PROTOCOL
    for name in PROTOCOL:
        theirs = inspect.signature(getattr(SchedulerInterface, name))
        ours = inspect.signature(getattr(Scheduler, name))
        assert list(ours.parameters) == list(theirs.parameters), name


def test_links_import_no_scheduler_internals() -> None:
    for path in LINKS:
        for node in ast.walk(_tree(path)):
            if isinstance(node, ast.ImportFrom) and node.module:
                bad = [m for m in FORBIDDEN_IMPORTS if node.module.startswith(m)]
                assert not bad, f"{path.name} imports {node.module}"


def test_links_read_no_private_attribute_of_another_object() -> None:
    for path in LINKS:
        for node in ast.walk(_tree(path)):
            if isinstance(node, ast.Attribute) and node.attr.startswith("_"):
                owner = node.value
                mine = isinstance(owner, ast.Name) and owner.id in ("self", "cls")
                dunder = node.attr.startswith("__") and node.attr.endswith("__")
                assert mine or dunder, f"{path.name}:{node.lineno} reads .{node.attr}"


def test_the_servicer_uses_only_the_interface() -> None:
    tree = _tree(ROOT / "scheduler_service/links/frontend.py")
    (servicer,) = [
        n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "SchedulerServicer"
    ]
    (init,) = [n for n in servicer.body if isinstance(n, ast.FunctionDef) and n.name == "__init__"]
    annotation = init.args.args[1].annotation
    assert isinstance(annotation, ast.Name) and annotation.id == "SchedulerInterface"
    parents = {child: node for node in ast.walk(servicer) for child in ast.iter_child_nodes(node)}
    used = set()
    for node in ast.walk(servicer):
        if not (isinstance(node, ast.Attribute) and _is_self_sched(node)):
            continue
        parent = parents[node]
        if isinstance(parent, ast.Assign) and node in parent.targets:
            continue  # `self.sched = scheduler` in __init__
        # every other use is `self.sched.<method>`, a method of the protocol
        assert isinstance(parent, ast.Attribute), f"line {node.lineno}: self.sched handed on"
        assert parent.attr in PROTOCOL, f"line {node.lineno}: self.sched.{parent.attr}"
        used.add(parent.attr)
    assert used == PROTOCOL  # and the protocol holds nothing the links do not need


def test_get_stats_and_flush_go_through_the_interface() -> None:
    """The servicer's GetStats and FlushCache answer from the scheduler's snapshot and flush:
    every snapshot field reaches the proto, and a flush refuses while work waits."""
    import asyncio

    from radixmesh_wire.pb import api_pb2, scheduler_pb2
    from radixmesh_wire.step_ops import WorkerInfo
    from scheduler_service.config import SchedulerConfig
    from scheduler_service.links.frontend import SchedulerServicer
    from scheduler_service.request import Request, SamplingSpec

    sched = Scheduler(SchedulerConfig())
    servicer = SchedulerServicer(sched)

    async def scenario() -> tuple[api_pb2.Stats, api_pb2.Stats, list[bool]]:
        empty = await servicer.GetStats(api_pb2.GetStatsRequest(), None)  # type: ignore[arg-type]
        sched.model.connected(WorkerInfo("fake", 256, 64, 100, False, (2,), "cpu"))
        req = Request("a", "s", [1, 2, 3], SamplingSpec(max_new_tokens=2), frozenset({2}), key=1)
        sched.submit(req)
        flush = scheduler_pb2.FlushCacheRequest()
        busy = await servicer.FlushCache(flush, None)  # type: ignore[arg-type]
        stats = await servicer.GetStats(api_pb2.GetStatsRequest(), None)  # type: ignore[arg-type]
        sched.abort("a")
        sched._reap_aborted()
        idle = await servicer.FlushCache(flush, None)  # type: ignore[arg-type]
        return empty, stats, [busy.flushed, idle.flushed]

    empty, stats, flushed = asyncio.run(scenario())
    assert empty == api_pb2.Stats()
    assert stats.queue_length == 1 and stats.kv_capacity == 256 and stats.kv_free == 256
    assert stats.token_usage == 0.0
    assert flushed == [False, True]
