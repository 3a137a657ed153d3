"""Kill the front door: in-flight requests without retry fail with UNAVAILABLE and free their
slots, the launcher restarts it, and new requests succeed again. (Model and scheduler restarts
are survived: tests/integration/test_restart.py.) Uses its own stack: it breaks things."""

from __future__ import annotations

import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import grpc
import pytest
from radixmesh.api import Client, RadixMeshError
from radixmesh.retry import NO_RETRY

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
        pool.submit(
            c.generate, f"Story number {i}:", max_new_tokens=500, ignore_eos=True, retry=NO_RETRY
        )
        for i in range(n)
    ]
    assert _until(lambda: c.stats().running_requests >= n, 30)
    return futs


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
