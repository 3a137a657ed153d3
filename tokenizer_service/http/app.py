"""The HTTP front door: an aiohttp server on the tokenizer service's event loop, next to the
gRPC API and over the same core. OpenAI routes (http_openai), SGLang routes (http_sglang),
liveness (/health) and readiness (/ready, /health/ready)."""

from __future__ import annotations

import ssl
import uuid
from collections.abc import Awaitable, Callable

import structlog
from aiohttp import web
from aiohttp.typedefs import Middleware
from prometheus_client.exposition import choose_encoder

from tokenizer_service.auth import ApiKeys
from tokenizer_service.config import TokenizerConfig
from tokenizer_service.core import FrontDoor
from tokenizer_service.http.errors import (
    MAX_BODY,
    REQUEST_ID,
    REQUEST_ID_HEADER,
    REQUEST_ID_RULE,
    TENANT,
    HttpError,
    error_response,
    valid_request_id,
)
from tokenizer_service.http.openai import OpenAIApi
from tokenizer_service.http.sglang import SGLangApi

log = structlog.get_logger(__name__)

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


@web.middleware
async def _request_id(request: web.Request, handler: Handler) -> web.StreamResponse:
    """One id per HTTP request, the client's `X-Request-Id` or a new one, returned in the
    same header (a streamed response gets it in sse.open_stream)."""
    rid = request.headers.get(REQUEST_ID_HEADER)
    if rid is None:
        rid = uuid.uuid4().hex
    elif not valid_request_id(rid):
        err = HttpError(
            400,
            f"{REQUEST_ID_HEADER} must be {REQUEST_ID_RULE}",
            param=REQUEST_ID_HEADER,
        )
        return error_response(err)
    request[REQUEST_ID] = rid
    resp = await handler(request)
    if not resp.prepared:
        resp.headers[REQUEST_ID_HEADER] = rid
    return resp


@web.middleware
async def _errors(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Every error leaves in OpenAI's shape, aiohttp's own (404, 405, 413) included."""
    try:
        return await handler(request)
    except HttpError as err:
        return error_response(err)
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        kind = "not_found_error" if exc.status == 404 else "invalid_request_error"
        return error_response(HttpError(exc.status, exc.reason, kind))


_OPEN = frozenset({"/health", "/ready", "/health/ready"})  # probes reveal nothing
_ADMIN = frozenset(
    {"/server_info", "/get_server_info", "/flush_cache", "/metrics"}
)  # like GetStats


def _auth(keys: ApiKeys) -> Middleware:
    """API keys on HTTP as on gRPC: `Authorization: Bearer KEY`, 401 without a known key, 403
    for admin paths without the admin scope; the caller's tenant goes to the handlers."""

    @web.middleware
    async def auth(request: web.Request, handler: Handler) -> web.StreamResponse:
        if request.path in _OPEN:
            return await handler(request)
        who = keys.identify(request.headers.get("Authorization"))
        if who is None:
            raise HttpError(
                401,
                "a valid API key is required (Authorization: Bearer KEY)",
                "authentication_error",
                code="invalid_api_key",
            )
        if request.path in _ADMIN and not who.admin:
            raise HttpError(403, f"{request.path} needs an admin API key", "permission_error")
        request[TENANT] = who.tenant
        return await handler(request)

    return auth


def build_app(
    core: FrontDoor, cfg: TokenizerConfig, model_path: str, keys: ApiKeys | None = None
) -> web.Application:
    middlewares: list[Middleware] = [_request_id, _errors, _auth(keys or ApiKeys({}))]
    app = web.Application(middlewares=middlewares, client_max_size=cfg.http_max_body_bytes)
    app[MAX_BODY] = cfg.http_max_body_bytes
    names = [cfg.served_model_name or core.tok.model_name]
    server_args = {
        "model_path": model_path,
        "served_model_name": names[0],
        "http_port": cfg.http_port,
        "port": cfg.port,
    }

    async def health(request: web.Request) -> web.Response:
        return web.Response(text="")

    async def ready(request: web.Request) -> web.Response:
        if core.ready:
            return web.json_response({"ready": True})
        err = HttpError(503, "not ready: the scheduler is not connected", "unavailable")
        return error_response(err)

    async def metrics(request: web.Request) -> web.Response:
        # The format the scraper asks for (OpenMetrics or text), as prometheus-client's own
        # server on --metrics-port answers; plain names read the same in both.
        encode, content_type = choose_encoder(request.headers.get("Accept", ""))
        body = encode(core.metrics.registry)
        return web.Response(body=body, headers={"Content-Type": content_type})

    app.add_routes(
        [
            web.get("/health", health),
            web.get("/ready", ready),
            web.get("/health/ready", ready),
            web.get("/metrics", metrics),  # admin scope when keys are on (global figures)
        ]
    )
    app.add_routes(OpenAIApi(core, names).routes())
    app.add_routes(SGLangApi(core, model_path, server_args).routes())
    return app


async def start_http(
    app: web.Application,
    host: str,
    port: int,
    tls: ssl.SSLContext | None = None,
    reuse_port: bool = False,
) -> web.AppRunner:
    # handler_cancellation: a client that disconnects cancels its handler, which closes the
    # core's generator and so aborts its request and frees its KV slots at once.
    runner = web.AppRunner(app, handler_cancellation=True, access_log=None)
    await runner.setup()
    # reuse_port: several front doors share the port (SO_REUSEPORT, --reuse-port)
    site = web.TCPSite(runner, host, port, ssl_context=tls, reuse_port=reuse_port or None)
    await site.start()
    log.info("http_listening", address=f"{host}:{port}")
    return runner
