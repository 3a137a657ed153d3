"""One streamed OpenAI response (chat or completions): the SSE frames of a request's events.

Per event this is the front door's hottest HTTP path (thousands of streams, an event per few
tokens each), so a plain text event takes the pre-split frames of `openai_frames` instead of
building and encoding the chunk object; the rare events (the role, an echo, logprobs, tool
calls, a finish, usage) are built as objects by `Shape`. The last frames leave with the end
of the response in one write.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import aclosing
from typing import TYPE_CHECKING

from aiohttp import web

from tokenizer_service.core import FrontDoor, GenerateError, GenerateInput
from tokenizer_service.events import Chunk, Complete, Event
from tokenizer_service.http.fanout import merged
from tokenizer_service.http.openai_params import openai_error
from tokenizer_service.http.sse import DONE, frame, open_stream

if TYPE_CHECKING:
    from tokenizer_service.http.openai import Shape
    from tokenizer_service.http.tools import StreamedCalls


class OpenAIStream:
    def __init__(self, core: FrontDoor, inputs: list[GenerateInput], shape: Shape) -> None:
        self.core = core
        self.inputs = inputs
        self.shape = shape
        self.results: dict[int, Complete] = {}  # choice -> its end, as they come
        # What goes out with the end of the response: the last finish, usage, an error. One
        # write (and one socket send) instead of one per frame, then the chunked EOF.
        self.tail = b""

    async def serve(self, request: web.Request) -> web.StreamResponse:
        resp = await open_stream(request)
        await self.run(resp)
        return resp

    async def run(self, resp: web.StreamResponse) -> None:
        """Every frame of the response, into `resp` (opened), and its end."""
        self.resp = resp
        try:
            await self._opening()
            calls = self.shape.tool_streams(len(self.inputs))
            if calls is None and not self.shape.req.logprobs and len(self.inputs) == 1:
                await self._one_text_stream()
            else:
                await self._events(calls)
            if self.shape.req.include_usage:
                ordered = [self.results[i] for i in sorted(self.results)]
                self.tail += frame(self.shape.usage_chunk(ordered))
        except GenerateError as exc:
            self.tail += frame(openai_error(exc).body())
        await self.resp.write_eof(self.tail + DONE)

    async def _opening(self) -> None:
        """Chat: each choice's role event; completions with echo: each prompt's text."""
        shape = self.shape
        for i, inp in enumerate(self.inputs):
            if shape.chat:
                await self.resp.write(frame(shape.chunk(i, role=True)))
            elif shape.req.echo:
                echo = (
                    inp.text if inp.text is not None else self.core.tok.decode(inp.input_ids or [])
                )
                await self.resp.write(frame(shape.chunk(i, text=echo)))

    async def _events(self, calls: list[StreamedCalls] | None) -> None:
        async with aclosing(merged(self.core, self.inputs)) as events:
            if calls is not None:  # the reply's text goes through the tool parser
                async for i, ev in events:
                    await self._tool_event(calls[i], i, ev)
            elif self.shape.req.logprobs:
                async for i, ev in events:
                    if not isinstance(ev, Chunk):
                        await self._finish(i, ev)
                    elif ev.text or ev.logprobs:
                        await self.resp.write(frame(self.shape.chunk(i, ev)))
            else:
                await self._text_events(events)

    async def _one_text_stream(self) -> None:
        """`_text_events` of one choice, straight from the core (no `merged` hop per event)."""
        texts = self.shape.text_frames(1)
        write = self.resp.write
        async with aclosing(self.core.generate(self.inputs[0])) as events:
            async for ev in events:
                if isinstance(ev, Chunk):
                    if ev.text or ev.logprobs:
                        await write(texts.frame(0, ev.text))
                else:
                    await self._finish(0, ev)

    async def _text_events(self, events: AsyncIterator[tuple[int, Event]]) -> None:
        """The common stream: text events (no logprobs, no tools) and the finishes."""
        texts = self.shape.text_frames(len(self.inputs))
        write = self.resp.write
        async for i, ev in events:
            if isinstance(ev, Chunk):
                if ev.text or ev.logprobs:
                    await write(texts.frame(i, ev.text))
            else:
                await self._finish(i, ev)

    async def _tool_event(self, calls: StreamedCalls, i: int, ev: Chunk | Complete) -> None:
        deltas = calls.feed(ev.text) if isinstance(ev, Chunk) else calls.finish()
        for d in deltas:
            await self.resp.write(frame(self.shape.delta_chunk(i, d)))
        if isinstance(ev, Complete):
            await self._finish(i, ev, called=calls.sent > 0)

    async def _finish(self, i: int, ev: Complete, called: bool = False) -> None:
        self.results[i] = ev
        end = frame(self.shape.chunk(i, finish=ev, called=called))
        if len(self.results) < len(self.inputs):
            await self.resp.write(end)
        else:  # the last choice's: nothing but usage and [DONE] can follow it
            self.tail = end
