"""`radixmesh serve --front-doors N`: N front doors on one public address (issue 27). The plan
gives them one gRPC port and one HTTP port with --reuse-port and a health-only port each; the
start-up port check accepts the shared ports, and still refuses a foreign process on them."""

from __future__ import annotations

import socket

from services.ports import first_problem, port_in_use
from services.serve_cmd import check_plan
from services.topology import Topology, free_port, topology_specs


def _specs(topo: Topology, http: int) -> tuple[list, dict[str, int]]:
    table = {name: free_port() for name in topo.names()}
    return topology_specs(topo, table.__getitem__, http_port=http), table


def test_front_doors_share_one_address_and_keep_their_own_health_ports() -> None:
    topo = Topology(replicas=2, front_doors=3, shared_port=True)
    assert topo.names()[0] == "tokenizer" and not topo.is_service("tokenizer")
    http = free_port()
    specs, table = _specs(topo, http)
    doors = [s for s in specs if s.public]
    assert [s.name for s in doors] == ["tokenizer-0", "tokenizer-1", "tokenizer-2"]
    assert {s.port for s in doors} == {table["tokenizer"]}
    assert [s.health_port for s in doors] == [table[s.name] for s in doors]
    assert all("--reuse-port" in s.args and f"--http-port={http}" in s.args for s in doors)
    assert {s.name for s in specs} == set(filter(topo.is_service, topo.names()))
    assert check_plan(specs) is None


def test_separate_front_doors_are_unchanged() -> None:
    topo = Topology(front_doors=2)  # the router bench and tests address each one
    http = free_port()
    specs, table = _specs(topo, http)
    doors = [s for s in specs if s.public]
    assert [s.port for s in doors] == [table["tokenizer-0"], table["tokenizer-1"]]
    assert all(s.health_port == 0 and "--reuse-port" not in s.args for s in doors)
    assert f"--http-port={http}" in doors[0].args
    assert f"--http-port={http + 1}" in doors[1].args


def test_a_foreign_process_on_the_shared_port_is_still_refused() -> None:
    specs, table = _specs(Topology(front_doors=2, shared_port=True), 0)
    with socket.socket() as s:  # no SO_REUSEPORT: front doors could not join it
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind(("127.0.0.1", table["tokenizer"]))
        s.listen()
        problem = check_plan(specs)
    assert problem is not None and str(table["tokenizer"]) in problem and "--port" in problem


def test_a_sibling_holding_the_shared_port_leaves_it_usable() -> None:
    port = free_port()
    with socket.socket() as s:  # as a running front door binds it (a restart checks this)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        s.bind(("127.0.0.1", port))
        s.listen()
        assert not port_in_use("127.0.0.1", port, shared=True)
        assert port_in_use("127.0.0.1", port)


def test_one_port_for_two_different_owners_is_still_a_conflict() -> None:
    from services.ports import PortUse

    port = free_port()
    uses = [PortUse(port, "the front doors' gRPC port", "--port", True)] * 2
    assert first_problem(uses) is None
    clash = [uses[0], PortUse(port, "the scheduler service's gRPC port")]
    assert "would be both" in (first_problem(clash) or "")


def test_serve_router_reaches_every_front_door_with_the_front_doors_choices() -> None:
    from services.cli import ROUTERS, build_parser
    from services.serve_cmd import build_specs
    from tokenizer_service.config import TokenizerConfig

    assert list(ROUTERS) == TokenizerConfig.__dataclass_fields__["router"].metadata["choices"]
    ns = build_parser().parse_args(["serve", "--router", "round_robin", "--front-doors", "2"])
    specs = build_specs(ns, Topology(front_doors=2, shared_port=True), "default")
    doors = [s for s in specs if s.public]
    assert len(doors) == 2 and all("--router round_robin" in " ".join(s.args) for s in doors)


def test_serve_host_tier_write_reaches_the_schedulers() -> None:
    from scheduler_service.config import SchedulerConfig
    from services.cli import HOST_TIER_WRITES, build_parser
    from services.serve_cmd import build_specs

    field = SchedulerConfig.__dataclass_fields__["host_tier_write"]
    assert list(HOST_TIER_WRITES) == field.metadata["choices"]
    args = ["serve", "--host-kv-tokens", "1000", "--host-tier-write", "write_through"]
    specs = build_specs(build_parser().parse_args(args), Topology(), "default")
    (sched,) = [s for s in specs if s.name == "scheduler"]
    assert "--host-tier-write write_through" in " ".join(sched.args)
