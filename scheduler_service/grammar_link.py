"""The scheduler's end of the grammar service: Compile at submission, and one Masks stream.

The scheduler's log of accepted tokens is the truth: after the stream breaks and reconnects,
`on_reconnect` re-binds every constrained running request with its output so far (replay), so
a restarted grammar service rebuilds its matchers. While the link is down constrained requests
simply wait; unconstrained ones never notice.
"""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections import deque
from collections.abc import Callable

import grpc
import structlog

from radixmesh_server.server import channel
from radixmesh_wire.mask_step import grammar_spec
from radixmesh_wire.pb import grammar_pb2, grammar_pb2_grpc

log = structlog.get_logger(__name__)


class GrammarUnavailable(Exception):
    pass


class GrammarLink:
    def __init__(self, address: str) -> None:
        self.address = address
        self.up = asyncio.Event()
        self.vocab_size = 0
        self._chan = channel(address)
        self._stub = grammar_pb2_grpc.GrammarStub(self._chan)
        self._out: asyncio.Queue[grammar_pb2.MaskRequest | None] = asyncio.Queue()
        self._pending: deque[asyncio.Future[grammar_pb2.MaskStepResult]] = deque()
        self.on_reconnect: Callable[[], None] = lambda: None

    async def compile(self, kind: str, text: str, wait_s: float = 30.0) -> tuple[bool, str]:
        """(ok, xgrammar's message). If the service is down (restarting), wait up to `wait_s`
        for the mask session to come back and retry once; then GrammarUnavailable."""
        req = grammar_pb2.CompileRequest(grammar=grammar_spec(kind, text))
        for attempt in range(2):
            try:
                reply = await self._stub.Compile(req, timeout=60)
                return reply.ok, reply.error
            except grpc.aio.AioRpcError as exc:
                if attempt or exc.code() != grpc.StatusCode.UNAVAILABLE:
                    raise GrammarUnavailable(
                        f"grammar service: {exc.code().name}: {exc.details()}"
                    ) from exc
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(self.up.wait(), wait_s)
        raise AssertionError("unreachable")

    def step(self, msg: grammar_pb2.MaskStep) -> asyncio.Future[grammar_pb2.MaskStepResult]:
        fut: asyncio.Future[grammar_pb2.MaskStepResult] = asyncio.get_running_loop().create_future()
        if not self.up.is_set():
            fut.set_exception(GrammarUnavailable("grammar service is not connected"))
            return fut
        self._pending.append(fut)
        self._out.put_nowait(grammar_pb2.MaskRequest(step=msg))
        return fut

    async def run(self) -> None:
        """Keep one Masks session open; reconnect with backoff."""
        backoff = 0.1
        while True:
            try:
                await self._session()
                backoff = 0.1
            except grpc.aio.AioRpcError as exc:
                log.warning("grammar_link_down", code=exc.code().name)
            self.up.clear()
            while self._pending:
                fut = self._pending.popleft()
                if not fut.done():
                    fut.set_exception(GrammarUnavailable("grammar service lost"))
            await asyncio.sleep(backoff)
            backoff = min(backoff * 2, 2.0)

    async def _session(self) -> None:
        self._out = asyncio.Queue()
        sid = uuid.uuid4().hex[:12]

        async def requests():  # type: ignore[no-untyped-def]
            yield grammar_pb2.MaskRequest(open=grammar_pb2.OpenMasks(session_id=sid))
            while (msg := await self._out.get()) is not None:
                yield msg

        call = self._stub.Masks(requests())
        try:
            first = await call.read()
            if first is grpc.aio.EOF:
                return
            self.vocab_size = first.opened.info.vocab_size
            self.on_reconnect()  # queue re-binds before anything else is sent
            self.up.set()
            log.info("grammar_session", vocab=self.vocab_size)
            while (reply := await call.read()) is not grpc.aio.EOF:
                if self._pending:
                    fut = self._pending.popleft()
                    if not fut.done():
                        fut.set_result(reply.result)
        finally:
            self._out.put_nowait(None)
            with contextlib.suppress(Exception):
                call.cancel()
