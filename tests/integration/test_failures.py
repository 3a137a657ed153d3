"""Kill a service: in-flight requests that need it fail with UNAVAILABLE within 2 s and free
their slots, dependants' readiness drops (liveness does not), the launcher restarts it, and new
requests succeed again. Uses its own stack: it breaks things."""

from __future__ import annotations

import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import grpc
import pytest
from radixmesh.api import Client, RadixMeshError

from tests.conftest import Stack, start_stack

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def fragile(tmp_path_factory: pytest.TempPathFactory, model_dir: Path) -> Iterator[Stack]:
    yield from start_stack(
        tmp_path_factory.mktemp("fragile"), ["--kv-tokens", "8192"], ["--debug-invariants"]
    )


def _until(cond, timeout: float) -> bool:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cond():
            return True
        time.sleep(0.05)
    return bool(cond())


def _long_requests(c: Client, n: int = 3) -> list:
    pool = ThreadPoolExecutor(n)
    futs = [
        pool.submit(c.generate, f"Story number {i}:", max_new_tokens=500, ignore_eos=True)
        for i in range(n)
    ]
    assert _until(lambda: c.stats().running_requests >= n, 30)
    return futs


@pytest.mark.parametrize("victim,dependant", [("model", "scheduler"), ("scheduler", "tokenizer")])
def test_kill_service(fragile: Stack, victim: str, dependant: str) -> None:
    with Client(fragile.endpoint) as c:
        futs = _long_requests(c)
        killed_at = time.monotonic()
        fragile.launcher.kill(victim)
        for f in futs:
            with pytest.raises(RadixMeshError) as err:
                f.result(timeout=10)
            assert err.value.code == grpc.StatusCode.UNAVAILABLE, err.value
        assert time.monotonic() - killed_at < 2.0
        assert _until(lambda: not fragile.ready(dependant), 5), f"{dependant} readiness stayed"
        assert fragile.ready(dependant, "liveness"), f"{dependant} liveness must not drop"
        fragile.wait_ready(timeout=120)  # the launcher restarted it; the stack reconnects
        assert fragile.launcher.restarts[victim] >= 1
        res = c.generate("The capital of France is", max_new_tokens=4, temperature=0)
        assert res.completion_tokens == 4
        s = c.stats()
        assert s.running_requests == 0 and s.kv_request_owned == 0 and s.kv_locked == 0


def test_kill_tokenizer(fragile: Stack) -> None:
    with Client(fragile.endpoint) as c:
        futs = _long_requests(c, 2)
        fragile.launcher.kill("tokenizer")
        for f in futs:
            with pytest.raises(RadixMeshError) as err:
                f.result(timeout=10)
            assert err.value.code == grpc.StatusCode.UNAVAILABLE
    fragile.wait_ready(timeout=120)
    with Client(fragile.endpoint) as c:
        # the scheduler dropped the dead session's requests and their slots
        assert _until(lambda: c.stats().kv_request_owned == 0, 10)
        assert c.generate("Hello", max_new_tokens=2).completion_tokens == 2
