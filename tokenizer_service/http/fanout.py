"""Several generations for one HTTP request (OpenAI's `n`, a list of prompts, SGLang batches).

`n` choices share their prompt: it is prefilled once by a max_new_tokens=0 request, which
leaves it in the radix cache, and the n choices then match all of it but the last token, so
the prompt is computed once however the scheduler batches them.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator
from contextlib import aclosing, suppress
from dataclasses import replace

from radixmesh_wire.pb import api_pb2
from tokenizer_service.core import FrontDoor, GenerateError, GenerateInput
from tokenizer_service.events import Complete, Event


def name_inputs(rid: str, inputs: list[GenerateInput]) -> None:
    """The HTTP request's id names its generations: itself for one, `rid-0`, `rid-1`, ...
    for several (each core request needs its own id; all share the prefix a log search
    finds)."""
    for i, inp in enumerate(inputs):
        inp.rid = rid if len(inputs) == 1 else f"{rid}-{i}"


async def prefill_once(core: FrontDoor, inp: GenerateInput) -> tuple[list[int], int]:
    """Validates `inp` as the choices will be, caches its prompt; returns (prompt ids, prompt
    tokens that were already cached before this request)."""
    ids, _ = await core.prepare(inp)
    pre = GenerateInput(
        rid=f"{inp.rid}-prefill" if inp.rid else "",
        input_ids=ids,
        sampling=api_pb2.SamplingParams(max_new_tokens=0, temperature=0),
        tenant=inp.tenant,  # the choices must find it in their own cache namespace
        cache_salt=inp.cache_salt,
        image_inputs=inp.image_inputs,  # prepared: `ids` hold their pseudo ids
    )
    done = await core.run(pre)
    return ids, done.cached_tokens


def choice_inputs(inp: GenerateInput, ids: list[int], n: int) -> list[GenerateInput]:
    """n copies on the same prompt ids; a fixed seed s becomes s + i, so seeded choices differ
    from each other and stay reproducible."""
    out = []
    for i in range(n):
        s = api_pb2.SamplingParams()
        s.CopyFrom(inp.sampling)
        if s.HasField("seed"):
            s.seed = (s.seed + i) % (1 << 63)
        rid = f"{inp.rid}-{i}" if inp.rid else ""
        out.append(replace(inp, rid=rid, text=None, messages=None, input_ids=ids, sampling=s))
    return out


async def run_all(core: FrontDoor, inputs: list[GenerateInput]) -> list[Complete]:
    """Every input's result, in order; the first failure cancels (aborts) the others."""
    tasks = [asyncio.ensure_future(core.run(inp)) for inp in inputs]
    try:
        return list(await asyncio.gather(*tasks))
    finally:
        for t in tasks:
            t.cancel()
        for t in tasks:
            with suppress(asyncio.CancelledError, GenerateError):
                await t


async def merged(
    core: FrontDoor, inputs: list[GenerateInput]
) -> AsyncGenerator[tuple[int, Event], None]:
    """(input index, event) as they come; a failure of any input ends the stream with its
    GenerateError; leaving early aborts every input still running."""
    if len(inputs) == 1:  # the common case needs no pump task and queue hop per event
        async with aclosing(core.generate(inputs[0])) as events:
            async for ev in events:
                yield 0, ev
        return
    queue: asyncio.Queue[tuple[int, Event | BaseException | None]] = asyncio.Queue()

    async def pump(i: int, inp: GenerateInput) -> None:
        try:
            async with aclosing(core.generate(inp)) as events:
                async for ev in events:
                    queue.put_nowait((i, ev))
            queue.put_nowait((i, None))
        except GenerateError as exc:
            queue.put_nowait((i, exc))

    tasks = [asyncio.ensure_future(pump(i, inp)) for i, inp in enumerate(inputs)]
    try:
        left = len(tasks)
        while left:
            i, item = await queue.get()
            if item is None:
                left -= 1
            elif isinstance(item, BaseException):
                raise item
            else:
                yield i, item
    finally:
        for t in tasks:
            t.cancel()
        for t in tasks:
            with suppress(asyncio.CancelledError):
                await t
