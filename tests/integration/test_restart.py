"""Restart any service while requests stream: every in-flight request completes token-identical
to an undisturbed seeded run (issue 13). One stack of its own (it breaks things), short
generations; the model is also frozen with SIGSTOP to check liveness detection (issue 12.10)."""

from __future__ import annotations

import asyncio
import signal
import time
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from radixmesh.api import Client, GenerateResult

from services.launcher import check_ready
from tests.conftest import Stack, start_stack

pytestmark = pytest.mark.integration

PROMPTS: list[tuple[str, dict[str, Any]]] = [
    ("Once upon a time", {"temperature": 0.8, "seed": 11}),
    ("The three laws of robotics are", {"temperature": 0}),
    ("def fibonacci(n):", {"temperature": 0.7, "seed": 5, "top_k": 40}),
    ("A list of fruits: apple,", {"temperature": 0, "stop": [" cherry"]}),
]
NEW = 48


@pytest.fixture(scope="module")
def rstack(tmp_path_factory: pytest.TempPathFactory, model_dir: Path) -> Iterator[Stack]:
    for st in start_stack(
        tmp_path_factory.mktemp("restart"),
        ["--kv-tokens", "8192"],
        ["--debug-invariants", "--model-probe-s", "0.5"],
    ):
        st.launcher.liveness_timeout_s = 6.0  # restart a frozen service quickly
        yield st


def _until(cond, timeout: float) -> bool:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cond():
            return True
        time.sleep(0.05)
    return bool(cond())


def _ready(addr: str, service: str = "readiness") -> bool:
    return asyncio.run(check_ready(addr, service))


@pytest.fixture(scope="module")
def reference(rstack: Stack) -> list[GenerateResult]:
    with Client(rstack.endpoint) as c:
        return [c.generate(p, max_new_tokens=NEW, ignore_eos=True, **kw) for p, kw in PROMPTS]


def _stream_all(c: Client, progress: list[int]) -> list[Future[GenerateResult]]:
    """Start every prompt streaming; progress[i] counts token ids received by request i."""

    def one(i: int) -> GenerateResult:
        p, kw = PROMPTS[i]
        for item in c.stream(p, max_new_tokens=NEW, ignore_eos=True, **kw):
            if isinstance(item, GenerateResult):
                return item
            progress[i] += len(item.token_ids)
        raise AssertionError("stream ended without a result")

    pool = ThreadPoolExecutor(len(PROMPTS))
    return [pool.submit(one, i) for i in range(len(PROMPTS))]


def _check_identical(got: list[GenerateResult], ref: list[GenerateResult]) -> None:
    for g, r in zip(got, ref, strict=True):
        assert g.output_ids == r.output_ids
        assert g.text == r.text
        assert g.finish_reason == r.finish_reason


def _assert_drained(c: Client) -> None:
    assert _until(lambda: c.stats().running_requests == 0, 10)
    s = c.stats()
    assert s.queue_length == 0 and s.kv_request_owned == 0 and s.kv_locked == 0


def _disturb(rstack: Stack, ref: list[GenerateResult], act) -> float:  # type: ignore[no-untyped-def]
    """Stream every prompt, call `act` once each has some tokens, return the results' wall."""
    progress = [0] * len(PROMPTS)
    with Client(rstack.endpoint, timeout=120) as c:
        futs = _stream_all(c, progress)
        assert _until(lambda: min(progress) >= 2, 60), progress
        t0 = time.monotonic()
        act()
        got = [f.result(timeout=120) for f in futs]
        _check_identical(got, ref)
        _assert_drained(c)
        return time.monotonic() - t0


def test_model_kill9_continues(rstack: Stack, reference: list[GenerateResult]) -> None:
    restarts = rstack.launcher.restarts["model"]
    _disturb(rstack, reference, lambda: rstack.launcher.kill("model"))
    assert rstack.launcher.restarts["model"] == restarts + 1


def test_model_sigstop_detected(rstack: Stack, reference: list[GenerateResult]) -> None:
    """A frozen model is noticed in seconds (readiness drops), requests wait; once it runs
    again they finish identical."""
    sched = rstack.address("scheduler")

    def freeze() -> None:
        rstack.launcher.kill("model", signal.SIGSTOP)
        t0 = time.monotonic()
        try:
            assert _until(lambda: not _ready(sched), 10), "scheduler readiness did not drop"
            print(f"frozen model noticed in {time.monotonic() - t0:.1f} s")  # a figure
        finally:
            rstack.launcher.kill("model", signal.SIGCONT)

    _disturb(rstack, reference, freeze)


def test_model_frozen_is_restarted(rstack: Stack, reference: list[GenerateResult]) -> None:
    """Left frozen, the model stops answering its liveness check: the launcher kills and
    restarts it, and the held continuations finish identical."""
    restarts = rstack.launcher.restarts["model"]
    _disturb(rstack, reference, lambda: rstack.launcher.kill("model", signal.SIGSTOP))
    assert rstack.launcher.restarts["model"] == restarts + 1


def test_scheduler_kill9_resubmits(rstack: Stack, reference: list[GenerateResult]) -> None:
    """The front door holds every live request and resubmits it as a continuation."""
    restarts = rstack.launcher.restarts["scheduler"]
    _disturb(rstack, reference, lambda: rstack.launcher.kill("scheduler"))
    assert rstack.launcher.restarts["scheduler"] == restarts + 1


def test_front_door_kill9_client_resumes(rstack: Stack, reference: list[GenerateResult]) -> None:
    """The client library resumes each broken stream as a continuation of the ids it got."""
    restarts = rstack.launcher.restarts["tokenizer"]
    _disturb(rstack, reference, lambda: rstack.launcher.kill("tokenizer"))
    assert rstack.launcher.restarts["tokenizer"] == restarts + 1
