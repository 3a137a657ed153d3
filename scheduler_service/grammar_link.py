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
from radixmesh_wire.mask_step import (
    MaskStepOutcome,
    MaskStepPlan,
    decode_mask_result,
    encode_mask_step,
    grammar_spec,
)
from radixmesh_wire.pb import grammar_pb2, grammar_pb2_grpc
from scheduler_service.status import GrammarUnavailable

log = structlog.get_logger(__name__)

__all__ = ["GrammarLink", "GrammarUnavailable"]


class GrammarLink:
    def __init__(self, address: str) -> None:
        self.address = address
        self.up = asyncio.Event()
        self.vocab_size = 0
        self._chan = channel(address)
        self._stub = grammar_pb2_grpc.GrammarStub(self._chan)
        self._out: asyncio.Queue[grammar_pb2.MaskRequest | None] = asyncio.Queue()
        # Sent steps' futures, and whether each asked for jump-forwards.
        self._pending: deque[tuple[asyncio.Future[MaskStepOutcome], bool]] = deque()
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

    def step(self, plan: MaskStepPlan) -> asyncio.Future[MaskStepOutcome]:
        """Send one mask step; the future gets its decoded result (results come in order)."""
        fut: asyncio.Future[MaskStepOutcome] = asyncio.get_running_loop().create_future()
        if not self.up.is_set():
            fut.set_exception(GrammarUnavailable("grammar service is not connected"))
            return fut
        self._pending.append((fut, bool(plan.jump)))
        self._out.put_nowait(grammar_pb2.MaskRequest(step=encode_mask_step(plan)))
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
                fut, _ = self._pending.popleft()
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
                    fut, jumps = self._pending.popleft()
                    if not fut.done():
                        _resolve(fut, reply.result, jumps)
        finally:
            self._out.put_nowait(None)
            with contextlib.suppress(Exception):
                call.cancel()


def _resolve(
    fut: asyncio.Future[MaskStepOutcome], res: grammar_pb2.MaskStepResult, jumps: bool
) -> None:
    try:
        fut.set_result(decode_mask_result(res, jumps_asked=jumps))
    except ValueError as exc:  # a reply this side cannot read: its rows wait, as if it were lost
        log.error("grammar_reply_unreadable", step=res.step_id, error=str(exc))
        fut.set_exception(GrammarUnavailable(f"unreadable grammar reply: {exc}"))
