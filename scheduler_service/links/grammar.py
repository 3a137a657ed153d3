"""The scheduler's end of one grammar service: Compile at submission, and one Masks stream.

A scheduler holds one link per grammar service (`grammar_pool.GrammarPool` owns them). The
scheduler's log of accepted tokens is the truth: when the stream breaks, `on_down` lets the pool
re-bind the matchers this service held on another one (or on this one once it is back) with
their output so far (replay). While no link is up constrained requests simply wait;
unconstrained ones never notice.
"""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections import deque
from collections.abc import Callable

import grpc
import structlog

from radixmesh_wire.mask_step import (
    MaskStepOutcome,
    MaskStepPlan,
    decode_mask_result,
    encode_mask_step,
    grammar_spec,
)
from radixmesh_wire.pb import grammar_pb2, grammar_pb2_grpc
from scheduler_service.status import GrammarLost, GrammarUnavailable
from services.reconnect import reconnect_forever
from services.server import channel

log = structlog.get_logger(__name__)

__all__ = ["GrammarLink", "GrammarLost", "GrammarUnavailable"]


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
        # Called (on the event loop) when a session opens, before `up` is set, and when an
        # open session ends, after `up` is cleared.
        self.on_up: Callable[[], None] = lambda: None
        self.on_down: Callable[[], None] = lambda: None

    async def compile(self, kind: str, text: str) -> tuple[bool, str]:
        """(ok, xgrammar's message). One attempt: GrammarLost when the service cannot be
        reached (the pool tries another or waits), GrammarUnavailable for any other failure."""
        req = grammar_pb2.CompileRequest(grammar=grammar_spec(kind, text))
        try:
            reply = await self._stub.Compile(req, timeout=60)
        except grpc.aio.AioRpcError as exc:
            what = f"grammar service {self.address}: {exc.code().name}: {exc.details()}"
            if exc.code() == grpc.StatusCode.UNAVAILABLE:
                raise GrammarLost(what) from exc
            raise GrammarUnavailable(what) from exc
        return reply.ok, reply.error

    def step(self, plan: MaskStepPlan) -> asyncio.Future[MaskStepOutcome]:
        """Send one mask step; the future gets its decoded result (results come in order)."""
        fut: asyncio.Future[MaskStepOutcome] = asyncio.get_running_loop().create_future()
        if not self.up.is_set():
            fut.set_exception(GrammarLost(f"grammar service {self.address} is not connected"))
            return fut
        self._pending.append((fut, bool(plan.jump)))
        self._out.put_nowait(grammar_pb2.MaskRequest(step=encode_mask_step(plan)))
        return fut

    async def run(self) -> None:
        """Keep one Masks session open; reconnect with backoff."""
        await reconnect_forever(self._attempt)

    async def _attempt(self) -> bool:
        """One Masks session to its end, then fail what it had pending; False when it failed."""
        ok = True
        try:
            await self._session()
        except grpc.aio.AioRpcError as exc:
            ok = False
            log.warning("grammar_link_down", address=self.address, code=exc.code().name)
        was_up = self.up.is_set()
        self.up.clear()
        while self._pending:
            fut, _ = self._pending.popleft()
            if not fut.done():
                fut.set_exception(GrammarLost(f"grammar service {self.address} lost"))
        if was_up:
            self.on_down()
        return ok

    async def close(self) -> None:
        """Forget this service (removed from the address spec); its run task is cancelled by
        the owner."""
        self.up.clear()
        while self._pending:
            fut, _ = self._pending.popleft()
            if not fut.done():
                fut.set_exception(GrammarLost(f"grammar service {self.address} removed"))
        await self._chan.close()

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
            self.on_up()
            self.up.set()
            log.info("grammar_session", address=self.address, vocab=self.vocab_size)
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
