"""Compiled-grammar cache: hits and misses, shared concurrent compiles, LRU bounds, error text,
error caching, and compiles that never block the event loop."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
import xgrammar as xgr

from grammar_service.compile_cache import CompileCache, GrammarError, GrammarKind
from grammar_service.suite import PAPER_REGEX
from grammar_service.tokenizer_source import default_tokenizer_dir, load_tokenizer

REGEX = GrammarKind.REGEX
JSON = GrammarKind.JSON_SCHEMA


@pytest.fixture(scope="module")
def tokenizer() -> Any:
    """The embedded model's tokenizer, built once and cached under the temp dir."""
    return load_tokenizer(default_tokenizer_dir())


@pytest.fixture(scope="module")
def tokenizer_info(tokenizer: Any) -> xgr.TokenizerInfo:
    return xgr.TokenizerInfo.from_huggingface(tokenizer)


def _slow_schema(n: int) -> str:
    """maxLength strings make xgrammar's compile slow (~0.1 s each on two cores)."""
    props = {f"f{i}": {"type": "string", "maxLength": 8 + i} for i in range(n)}
    return json.dumps({"type": "object", "properties": props, "required": list(props)})


def test_hit_and_miss(tokenizer_info: xgr.TokenizerInfo) -> None:
    async def main() -> None:
        cache = CompileCache(tokenizer_info)
        g1, cached1 = await cache.get(REGEX, PAPER_REGEX)
        g2, cached2 = await cache.get(REGEX, PAPER_REGEX)
        assert (cached1, cached2) == (False, True) and g1 is g2
        assert (cache.stats.misses, cache.stats.hits) == (1, 1)
        assert cache.peek(REGEX, PAPER_REGEX) is g1 and cache.peek(REGEX, "x") is None
        assert len(cache) == 1 and cache.nbytes == g1.memory_size_bytes > 0
        cache.close()

    asyncio.run(main())


def test_concurrent_requests_share_one_compile(tokenizer_info: xgr.TokenizerInfo) -> None:
    async def main() -> None:
        cache = CompileCache(tokenizer_info, disable_xgrammar_cache=True)
        results = await asyncio.gather(*(cache.get(JSON, _slow_schema(1)) for _ in range(8)))
        assert len({id(g) for g, _ in results}) == 1
        assert [c for _, c in results] == [False] + [True] * 7
        assert (cache.stats.misses, cache.stats.joins) == (1, 7)
        cache.close()

    asyncio.run(main())


def test_cancelled_waiter_does_not_cancel_the_compile(tokenizer_info: xgr.TokenizerInfo) -> None:
    async def main() -> None:
        cache = CompileCache(tokenizer_info, disable_xgrammar_cache=True)
        first = asyncio.create_task(cache.get(JSON, _slow_schema(1)))
        await asyncio.sleep(0)  # one loop turn: `first` starts the compile
        second = asyncio.create_task(cache.get(JSON, _slow_schema(1)))
        await asyncio.sleep(0)
        first.cancel()
        grammar, cached = await second
        assert cached and cache.peek(JSON, _slow_schema(1)) is grammar
        cache.close()

    asyncio.run(main())


def test_compiles_run_off_the_event_loop(tokenizer_info: xgr.TokenizerInfo) -> None:
    async def main() -> None:
        cache = CompileCache(tokenizer_info, disable_xgrammar_cache=True, compile_threads=1)
        ticks = 0
        done = asyncio.Event()

        async def ticker() -> None:
            nonlocal ticks
            while not done.is_set():
                ticks += 1
                await asyncio.sleep(0.002)

        tick_task = asyncio.create_task(ticker())
        loop = asyncio.get_running_loop()
        t0 = loop.time()
        await cache.get(JSON, _slow_schema(3))
        elapsed = loop.time() - t0
        done.set()
        await tick_task
        # A blocked loop would tick once; a free one ticks every couple of ms of the compile.
        assert elapsed > 0.02 and ticks >= 5, (elapsed, ticks)
        cache.close()

    asyncio.run(main())


def test_lru_bound_by_entries(tokenizer_info: xgr.TokenizerInfo) -> None:
    async def main() -> None:
        cache = CompileCache(tokenizer_info, max_entries=2)
        await cache.get(REGEX, "a+")
        await cache.get(REGEX, "b+")
        await cache.get(REGEX, "a+")  # touch: b+ is now least recently used
        await cache.get(REGEX, "c+")
        assert cache.peek(REGEX, "a+") and cache.peek(REGEX, "c+")
        assert cache.peek(REGEX, "b+") is None
        assert len(cache) == 2 and cache.stats.evictions == 1
        cache.close()

    asyncio.run(main())


def test_lru_bound_by_bytes(tokenizer_info: xgr.TokenizerInfo) -> None:
    async def main() -> None:
        cache = CompileCache(tokenizer_info, max_bytes=1)  # every grammar is bigger than this
        await cache.get(REGEX, "a+")
        await cache.get(REGEX, "b+")
        # The newest entry is kept even alone over the bound; older ones go.
        assert len(cache) == 1 and cache.peek(REGEX, "b+") is not None
        cache.close()
        roomy = CompileCache(tokenizer_info, max_bytes=10 << 20)
        for pat in ("a+", "b+", "c+"):
            await roomy.get(REGEX, pat)
        assert len(roomy) == 3 and roomy.nbytes <= 10 << 20
        roomy.close()

    asyncio.run(main())


@pytest.mark.parametrize(
    ("kind", "text", "needle"),
    [
        (REGEX, "(abc", "parenthesis is not closed"),
        (JSON, '{"type": "objec"}', 'Unsupported type "objec"'),
        (JSON, "{not json", "not valid JSON"),
        (GrammarKind.EBNF, "root ::= foo", 'Rule "foo" is not defined'),
        (GrammarKind.EBNF, 'root ::= "a" |', "EBNF parser error"),
    ],
)
def test_bad_grammar_error_text(
    tokenizer_info: xgr.TokenizerInfo, kind: GrammarKind, text: str, needle: str
) -> None:
    async def main() -> None:
        cache = CompileCache(tokenizer_info)
        with pytest.raises(GrammarError) as info:
            await cache.get(kind, text)
        msg = str(info.value)
        assert needle in msg
        assert ".cc:" not in msg and not msg.startswith("[")  # xgrammar's log prefix is gone
        cache.close()

    asyncio.run(main())


@pytest.mark.parametrize(("ttl", "compiles"), [(60.0, 1), (0.0, 2)])
def test_errors_cached_briefly_or_not_at_all(
    tokenizer_info: xgr.TokenizerInfo, ttl: float, compiles: int
) -> None:
    async def main() -> None:
        cache = CompileCache(tokenizer_info, error_ttl_s=ttl)
        for _ in range(2):
            with pytest.raises(GrammarError):
                await cache.get(REGEX, "[unclosed")
        assert cache.stats.misses == compiles and cache.stats.errors == compiles
        assert cache.nbytes == 0
        cache.close()

    asyncio.run(main())


def test_clear_forces_a_real_recompile(tokenizer_info: xgr.TokenizerInfo) -> None:
    async def main() -> None:
        cache = CompileCache(tokenizer_info, disable_xgrammar_cache=True)
        g1, _ = await cache.get(REGEX, PAPER_REGEX)
        cache.clear()
        assert len(cache) == 0 and cache.peek(REGEX, PAPER_REGEX) is None
        g2, cached = await cache.get(REGEX, PAPER_REGEX)
        assert not cached and g2 is not g1 and cache.stats.misses == 2
        cache.close()

    asyncio.run(main())


def test_bad_grammars_never_evict_good_ones(tokenizer_info: xgr.TokenizerInfo) -> None:
    async def main() -> None:
        cache = CompileCache(tokenizer_info, max_entries=1)
        good, _ = await cache.get(REGEX, "a+")
        for i in range(5):
            with pytest.raises(GrammarError):
                await cache.get(REGEX, f"[bad{i}")
        assert cache.peek(REGEX, "a+") is good and len(cache) == 1
        with pytest.raises(GrammarError):
            await cache.get(REGEX, "[bad0")  # still cached as an error: no new compile
        assert cache.stats.misses == 6
        cache.close()

    asyncio.run(main())
