"""HTTP errors in OpenAI's shape ({"error": {"message", "type", "param", "code"}}) and the
mapping from the core's gRPC-vocabulary statuses to HTTP codes."""

from __future__ import annotations

import json
from typing import Any

import grpc
from aiohttp import web

# What a status means for an HTTP client: 429 asks it to back off and retry, 503 to try another
# replica or later, 504 that its deadline passed; 400 is the caller's to fix.
_HTTP: dict[grpc.StatusCode, tuple[int, str]] = {
    grpc.StatusCode.INVALID_ARGUMENT: (400, "invalid_request_error"),
    grpc.StatusCode.OUT_OF_RANGE: (400, "invalid_request_error"),
    grpc.StatusCode.FAILED_PRECONDITION: (400, "invalid_request_error"),
    grpc.StatusCode.UNAUTHENTICATED: (401, "authentication_error"),
    grpc.StatusCode.PERMISSION_DENIED: (403, "permission_error"),
    grpc.StatusCode.NOT_FOUND: (404, "not_found_error"),
    grpc.StatusCode.RESOURCE_EXHAUSTED: (429, "rate_limit_error"),
    grpc.StatusCode.UNAVAILABLE: (503, "service_unavailable"),
    grpc.StatusCode.DEADLINE_EXCEEDED: (504, "timeout"),
    grpc.StatusCode.CANCELLED: (499, "cancelled"),
}


MAX_BODY = web.AppKey("max_body_bytes", int)
TENANT = web.RequestKey("tenant", str)  # the caller's tenant, set by the auth middleware
# The request's id: the client's `X-Request-Id` or a new one (app.py's middleware); it names
# the core request (several, `-1`, `-2` ..., for n > 1 or a prompt list), and every log line.
REQUEST_ID = web.RequestKey("request_id", str)
REQUEST_ID_HEADER = "X-Request-Id"
MAX_REQUEST_ID = 128
REQUEST_ID_RULE = f"1 to {MAX_REQUEST_ID} visible ASCII characters without quotes or backslashes"


def valid_request_id(rid: str) -> bool:
    """Request ids reach every service's logs: short, visible ASCII, no spaces or quotes."""
    return 0 < len(rid) <= MAX_REQUEST_ID and all(
        33 <= ord(c) < 127 and c not in "\"'\\" for c in rid
    )


class HttpError(Exception):
    """Raised by request parsing and handlers; rendered by `error_response`."""

    def __init__(
        self,
        status: int,
        message: str,
        type_: str = "invalid_request_error",
        param: str | None = None,
        code: str | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.type = type_
        self.param = param
        self.code = code

    def body(self) -> dict[str, Any]:
        return {
            "error": {
                "message": self.message,
                "type": self.type,
                "param": self.param,
                "code": self.code,
            }
        }


def from_status(status: grpc.StatusCode, message: str, param: str | None = None) -> HttpError:
    http, type_ = _HTTP.get(status, (500, "internal_error"))
    return HttpError(http, message, type_, param=param or None, code=status.name.lower())


def error_response(err: HttpError) -> web.Response:
    return web.json_response(err.body(), status=err.status)


async def read_json(request: web.Request) -> dict[str, Any]:
    """The request's JSON object body; 413 when too large, 400 when not a JSON object."""
    try:
        raw = await request.read()
    except web.HTTPRequestEntityTooLarge as exc:
        raise HttpError(
            413,
            f"the request body exceeds {request.app[MAX_BODY]} bytes",
            code="request_too_large",
        ) from exc
    try:
        body = json.loads(raw or b"{}")
    except ValueError as exc:
        raise HttpError(400, f"the body is not valid JSON: {exc}") from exc
    if not isinstance(body, dict):
        raise HttpError(400, "the body must be a JSON object")
    return body
