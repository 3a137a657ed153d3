"""Graceful shutdown (SIGTERM): stop accepting, let in-flight work finish, then end the rest.

Order, per service: readiness NOT_SERVING; the gRPC server refuses new calls while running ones
go on; `grace_s` later gRPC cancels what is left. Just before that, `before_cancel` lets a
service end its own in-flight work with a clear status (the front door answers UNAVAILABLE
"shutting down"), so no client sees a bare cancellation.

Across a stack the drain cascades by itself: each internal stream ends when its caller leaves
(the front door's last Generate ends, its scheduler session closes, then the scheduler's model
and grammar sessions), so an idle stack exits at once and a busy one when its last request ends.
Internal services get a few more seconds of grace than the front door (`INTERNAL_EXTRA_S`), so
requests that fit the front door's grace never lose a dependency first.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import grpc
import structlog

log = structlog.get_logger(__name__)

DEFAULT_GRACE_S = 30.0
INTERNAL_EXTRA_S = 5.0
CANCEL_MARGIN_S = 0.5  # before_cancel runs this long before gRPC cancels leftover calls


async def drain(
    server: grpc.aio.Server, grace_s: float, before_cancel: Callable[[], None] | None = None
) -> None:
    """Stop `server` gracefully (see the module docstring)."""
    stopping = asyncio.ensure_future(server.stop(grace_s))
    if before_cancel is not None:
        done, _ = await asyncio.wait({stopping}, timeout=max(grace_s - CANCEL_MARGIN_S, 0.0))
        if not done:
            log.warning("grace_expired", grace_s=grace_s)
            before_cancel()
    await stopping
