"""Address specs: fixed lists, DNS names (re-resolved) and files (re-read) name the peers;
a spec that names nothing fails at start-up with a message that says what to write."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from services.discovery import Discovery, parse_address_spec


def test_parse_specs() -> None:
    s = parse_address_spec("127.0.0.1:1, 127.0.0.1:2,127.0.0.1:1")
    assert s.kind == "static" and s.addresses == ("127.0.0.1:1", "127.0.0.1:2")
    d = parse_address_spec("dns:///replicas.ns.svc:50052")
    assert (d.kind, d.host, d.port) == ("dns", "replicas.ns.svc", 50052)
    assert parse_address_spec("file:/etc/x").path == "/etc/x"
    for bad in ("", "host", "host:x", "dns:///name", "file:", "a:1,b"):
        with pytest.raises(ValueError, match="host:port|no address|needs a path"):
            parse_address_spec(bad)


def test_dns_is_re_resolved() -> None:
    answers = [["10.0.0.1:50052"], ["10.0.0.1:50052"], ["10.0.0.1:50052", "10.0.0.2:50052"]]

    async def resolver(host: str, port: int) -> list[str]:
        assert (host, port) == ("r", 50052)
        if len(answers) > 1:
            return answers.pop(0)
        return answers[0]

    async def scenario() -> list[list[str]]:
        seen = []
        disc = Discovery(parse_address_spec("dns:///r:50052"), interval_s=0, resolver=resolver)
        async for addrs in disc.watch():
            seen.append(addrs)
            if len(seen) == 2:
                break
        return seen

    # Unchanged answers are not repeated: the watcher hears each set once.
    assert asyncio.run(scenario()) == [["10.0.0.1:50052"], ["10.0.0.1:50052", "10.0.0.2:50052"]]


def test_file_is_re_read(tmp_path: Path) -> None:
    f = tmp_path / "replicas"
    f.write_text("127.0.0.1:1  # first\n")

    async def scenario() -> list[list[str]]:
        seen = []
        async for addrs in Discovery(parse_address_spec(f"file:{f}"), interval_s=0).watch():
            seen.append(addrs)
            if len(seen) == 1:
                f.write_text("127.0.0.1:1\n127.0.0.1:2\n")
            else:
                break
        return seen

    assert asyncio.run(scenario()) == [["127.0.0.1:1"], ["127.0.0.1:1", "127.0.0.1:2"]]
