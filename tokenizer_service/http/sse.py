"""Server-sent events: `data: <json>\n\n` frames over a chunked aiohttp response."""

from __future__ import annotations

import json
from typing import Any

from aiohttp import web

from tokenizer_service.http.errors import REQUEST_ID, REQUEST_ID_HEADER

DONE = b"data: [DONE]\n\n"


async def open_stream(request: web.Request) -> web.StreamResponse:
    resp = web.StreamResponse(
        headers={
            "Content-Type": "text/event-stream",
            "Cache-Control": "no-cache",
            "X-Accel-Buffering": "no",  # proxies must not hold frames back
        }
    )
    if REQUEST_ID in request:  # headers leave with prepare: the middleware is too late
        resp.headers[REQUEST_ID_HEADER] = request[REQUEST_ID]
    await resp.prepare(request)
    return resp


def frame(obj: Any) -> bytes:
    return b"data: " + json.dumps(obj, ensure_ascii=False).encode() + b"\n\n"
