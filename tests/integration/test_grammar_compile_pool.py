"""Compile worker processes (issue 12, items 1, 9, 15): each compile is bounded in time and
memory with a message naming the flag, a compile nobody waits for is killed, and a small
grammar never waits behind big ones. Real worker processes, no gRPC."""

from __future__ import annotations

import asyncio
import json
import time

import pytest
import xgrammar as xgr

from grammar_service.compile_cache import CompileCache
from grammar_service.compile_pool import CompilePool
from grammar_service.kinds import GrammarError, GrammarKind
from grammar_service.tokenizer_source import default_tokenizer_dir, load_tokenizer

pytestmark = pytest.mark.integration  # starts processes or real servers

JSON = GrammarKind.JSON_SCHEMA
REGEX = GrammarKind.REGEX


@pytest.fixture(scope="module")
def tokenizer_info() -> xgr.TokenizerInfo:
    return xgr.TokenizerInfo.from_huggingface(load_tokenizer(default_tokenizer_dir()))


def slow_schema(n: int, tag: str = "f") -> str:
    """maxLength strings make xgrammar's compile slow (~0.1 s each on two cores)."""
    props = {f"{tag}{i}": {"type": "string", "maxLength": 8 + i} for i in range(n)}
    return json.dumps({"type": "object", "properties": props, "required": list(props)})


async def started(pool: CompilePool) -> None:
    """Wait (with a deadline) until every worker process runs: start-up is not under test."""
    deadline = time.monotonic() + 60
    while not all(w.proc is not None and w.proc.is_alive() for w in pool._workers):
        assert time.monotonic() < deadline, "compile workers did not start"
        await asyncio.sleep(0.05)


def test_compiles_in_a_worker_like_in_process(tokenizer_info: xgr.TokenizerInfo) -> None:
    async def main() -> None:
        pool = CompilePool(tokenizer_info, workers=1)
        try:
            g = await pool.compile(REGEX, "[0-9]{2}")
            m = xgr.GrammarMatcher(g)
            assert m.accept_string("42") and m.is_completed()
            with pytest.raises(GrammarError, match="parenthesis is not closed"):
                await pool.compile(REGEX, "(abc")
            with pytest.raises(GrammarError, match="non-finite number"):
                await pool.compile(JSON, '{"type": "number", "maximum": 1e999}')
        finally:
            pool.close()

    asyncio.run(main())


def test_a_compile_past_its_deadline_is_killed(tokenizer_info: xgr.TokenizerInfo) -> None:
    async def main() -> None:
        pool = CompilePool(tokenizer_info, workers=1, timeout_s=0.3)
        try:
            await started(pool)
            t0 = time.monotonic()
            with pytest.raises(GrammarError, match="--compile-timeout-s"):
                await pool.compile(JSON, slow_schema(60))
            print(f"killed at its deadline after {time.monotonic() - t0:.2f} s")  # a figure
            g = await pool.compile(REGEX, "a+")  # a fresh worker takes the next one
            assert g.memory_size_bytes > 0
        finally:
            pool.close()

    asyncio.run(main())


def test_a_compile_past_its_memory_bound_fails_alone(tokenizer_info: xgr.TokenizerInfo) -> None:
    async def main() -> None:
        pool = CompilePool(tokenizer_info, workers=1, memory_mb=2)
        try:  # a 3,000-state repetition needs ~10 MiB while it compiles
            with pytest.raises(GrammarError, match="--compile-memory-mb"):
                await pool.compile(REGEX, "[a-z]{1,3000}")
        finally:
            pool.close()
        roomy = CompilePool(tokenizer_info, workers=1, memory_mb=2048)
        try:
            assert (await roomy.compile(JSON, slow_schema(3))).memory_size_bytes > 0
        finally:
            roomy.close()

    asyncio.run(main())


def test_a_compile_nobody_waits_for_is_killed(tokenizer_info: xgr.TokenizerInfo) -> None:
    async def main() -> None:
        cache = CompileCache(tokenizer_info, isolation="process", compile_threads=1)
        assert cache._workers is not None
        worker = cache._workers._workers[0]
        try:
            await started(cache._workers)
            pid = worker.proc.pid
            with pytest.raises(TimeoutError):  # the client's deadline
                await asyncio.wait_for(cache.get(JSON, slow_schema(80)), 0.5)
            t0 = time.monotonic()
            g, cached = await cache.get(REGEX, "b+")  # not behind the abandoned 8 s compile
            assert not cached  # and its worker was replaced, not waited for (next line)
            print(f"next compile after an abandoned one: {time.monotonic() - t0:.2f} s")
            assert worker.proc.pid != pid and cache.stats.cancelled == 1
            assert cache.peek(JSON, slow_schema(80)) is None
        finally:
            cache.close()

    asyncio.run(main())


def test_small_grammars_do_not_wait_behind_big_ones(tokenizer_info: xgr.TokenizerInfo) -> None:
    async def main() -> None:
        pool = CompilePool(tokenizer_info, workers=2, threads=1, small_chars=256)
        try:
            await started(pool)
            big = [asyncio.create_task(pool.compile(JSON, slow_schema(60, t))) for t in "xy"]
            await asyncio.sleep(0)  # one loop turn: each compile() queues synchronously
            assert pool.queued == 1  # one big runs, the other waits (too big for the small lane)
            t0 = time.monotonic()
            await pool.compile(REGEX, "[a-z]{3}")
            small_s = time.monotonic() - t0
            assert not any(t.done() for t in big), "the big compiles should still be running"
            print(f"small grammar beside two big ones: {small_s:.2f} s")  # the order is above
            for t in big:
                t.cancel()
            await asyncio.gather(*big, return_exceptions=True)
        finally:
            pool.close()

    asyncio.run(main())


def test_cache_timeout_message_in_thread_isolation(tokenizer_info: xgr.TokenizerInfo) -> None:
    async def main() -> None:
        cache = CompileCache(tokenizer_info, timeout_s=0.2, disable_xgrammar_cache=True)
        try:
            with pytest.raises(GrammarError, match="--compile-timeout-s"):
                await cache.get(JSON, slow_schema(40))
        finally:
            cache.close()

    asyncio.run(main())
