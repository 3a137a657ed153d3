"""Channels to the front door: plaintext or TLS, with the API key sent on every call.

`api_key` defaults to $RADIXMESH_API_KEY; it travels as `authorization: Bearer KEY` metadata.
`tls`: False for plaintext, True to verify the server against the system's roots, or a path to
a CA bundle (PEM) for a private CA. Default: $RADIXMESH_TLS_CA if set, else plaintext.
"""

from __future__ import annotations

import collections
import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import grpc

Options = Sequence[tuple[str, Any]]


def _credentials(tls: bool | str | None) -> grpc.ChannelCredentials | None:
    if tls is None:
        tls = os.environ.get("RADIXMESH_TLS_CA") or False
    if tls is False or tls == "":
        return None
    if tls is True:
        return grpc.ssl_channel_credentials()
    return grpc.ssl_channel_credentials(Path(str(tls)).read_bytes())


def _auth_metadata(api_key: str | None) -> tuple[tuple[str, str], ...]:
    key = api_key if api_key is not None else os.environ.get("RADIXMESH_API_KEY", "")
    return (("authorization", f"Bearer {key}"),) if key else ()


class _Details(
    collections.namedtuple(
        "_Details",
        ["method", "timeout", "metadata", "credentials", "wait_for_ready", "compression"],
    ),
    grpc.ClientCallDetails,
):
    pass


class _SyncAuth(grpc.UnaryUnaryClientInterceptor, grpc.UnaryStreamClientInterceptor):
    def __init__(self, metadata: tuple[tuple[str, str], ...]) -> None:
        self.metadata = metadata

    def _details(self, d: grpc.ClientCallDetails) -> grpc.ClientCallDetails:
        md = [*(d.metadata or ()), *self.metadata]
        return _Details(
            d.method,
            d.timeout,
            md,
            d.credentials,
            getattr(d, "wait_for_ready", None),
            getattr(d, "compression", None),
        )

    def intercept_unary_unary(self, continuation: Callable[..., Any], d: Any, request: Any) -> Any:
        return continuation(self._details(d), request)

    def intercept_unary_stream(self, continuation: Callable[..., Any], d: Any, request: Any) -> Any:
        return continuation(self._details(d), request)


class _AsyncAuthBase:
    def __init__(self, metadata: tuple[tuple[str, str], ...]) -> None:
        self.metadata = metadata

    def _details(self, d: grpc.aio.ClientCallDetails) -> grpc.aio.ClientCallDetails:
        md = grpc.aio.Metadata(*(d.metadata or ()), *self.metadata)
        return grpc.aio.ClientCallDetails(d.method, d.timeout, md, d.credentials, d.wait_for_ready)


# Two classes, not one with both bases: grpc.aio files each interceptor under the first call
# kind it implements only (an if/elif), so a combined one never sees streaming calls.
class _AsyncAuthUnary(_AsyncAuthBase, grpc.aio.UnaryUnaryClientInterceptor):
    async def intercept_unary_unary(
        self, continuation: Callable[..., Any], d: Any, request: Any
    ) -> Any:
        return await continuation(self._details(d), request)


class _AsyncAuthStream(_AsyncAuthBase, grpc.aio.UnaryStreamClientInterceptor):
    async def intercept_unary_stream(
        self, continuation: Callable[..., Any], d: Any, request: Any
    ) -> Any:
        return await continuation(self._details(d), request)


def open_channel(
    endpoint: str, options: Options, api_key: str | None = None, tls: bool | str | None = None
) -> grpc.Channel:
    creds = _credentials(tls)
    chan = (
        grpc.secure_channel(endpoint, creds, options=options)
        if creds
        else grpc.insecure_channel(endpoint, options=options)
    )
    md = _auth_metadata(api_key)
    return grpc.intercept_channel(chan, _SyncAuth(md)) if md else chan


def open_aio_channel(
    endpoint: str, options: Options, api_key: str | None = None, tls: bool | str | None = None
) -> grpc.aio.Channel:
    creds = _credentials(tls)
    md = _auth_metadata(api_key)
    interceptors: list[Any] | None = [_AsyncAuthUnary(md), _AsyncAuthStream(md)] if md else None
    if creds:
        return grpc.aio.secure_channel(endpoint, creds, options=options, interceptors=interceptors)
    return grpc.aio.insecure_channel(endpoint, options=options, interceptors=interceptors)
