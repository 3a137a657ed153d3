"""API keys of the public front door, and the tenant each request belongs to.

Keys come from `--api-keys` (comma-separated), `--api-keys-file` (one key a line, optionally
`KEY tenant=NAME admin`; `#` starts a comment) or RADIXMESH_API_KEYS. With no key configured
the API is open and every caller is the anonymous tenant (a laptop setup).

A caller sends `authorization: Bearer KEY` (gRPC metadata; the HTTP API reads the same header).
Keys are kept only as SHA-256 digests, and a presented key is compared with every digest in
constant time, so neither the comparison nor an early exit reveals how much of a key matched.

The tenant isolates the prefix cache: `cache_namespace` mixes the tenant with the request's
optional `cache_salt`, and the scheduler never shares cached KV across namespaces, so one
tenant's `cached_tokens` (or timing) says nothing about another's prompts.
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc

ANONYMOUS = ""
# Operational methods: the admin scope only (when keys are configured).
ADMIN_METHODS = frozenset({"/radixmesh.v1.RadixMesh/GetStats"})
# Probes and discovery stay open: they reveal nothing about requests.
OPEN_PREFIXES = ("/grpc.health.v1.", "/grpc.reflection.")


@dataclass(frozen=True)
class Principal:
    tenant: str
    admin: bool = False


def _digest(key: str) -> bytes:
    return hashlib.sha256(key.encode()).digest()


class ApiKeys:
    def __init__(self, keys: dict[str, Principal]) -> None:
        self._entries = [(_digest(k), p) for k, p in keys.items()]

    @property
    def enabled(self) -> bool:
        return bool(self._entries)

    @classmethod
    def from_config(cls, keys: str, admin_keys: str, keys_file: str) -> ApiKeys:
        out: dict[str, Principal] = {}
        for k in _split(keys):
            out[k] = Principal(_key_tenant(k))
        for k in _split(admin_keys):
            out[k] = Principal(_key_tenant(k), admin=True)
        if keys_file:
            try:
                lines = Path(keys_file).read_text().splitlines()
            except OSError as exc:
                raise SystemExit(f"cannot read --api-keys-file: {exc}") from None
            for n, line in enumerate(lines, 1):
                words = line.split("#", 1)[0].split()
                if not words:
                    continue
                tenant, admin = _key_tenant(words[0]), False
                for w in words[1:]:
                    if w == "admin":
                        admin = True
                    elif w.startswith("tenant=") and len(w) > 7:
                        tenant = w[7:]
                    else:
                        raise SystemExit(f"{keys_file}:{n}: unknown word {w!r}")
                out[words[0]] = Principal(tenant, admin)
        return cls(out)

    def identify(self, authorization: str | None) -> Principal | None:
        """The caller behind an `authorization` value; None if it names no key. Open (no keys
        configured): everyone is the anonymous admin."""
        if not self._entries:
            return Principal(ANONYMOUS, admin=True)
        if not authorization or authorization[:7].lower() != "bearer ":
            return None
        presented = _digest(authorization[7:].strip())
        found: Principal | None = None
        for digest, principal in self._entries:  # no early exit: constant time in the keys
            if hmac.compare_digest(digest, presented):
                found = principal
        return found

    def of_metadata(self, metadata: Iterable[tuple[str, Any]] | None) -> Principal | None:
        auth = None
        for k, v in metadata or ():
            if k == "authorization":
                auth = v.decode() if isinstance(v, bytes) else str(v)
        return self.identify(auth)


def _split(text: str) -> list[str]:
    return [k.strip() for k in text.split(",") if k.strip()]


def _key_tenant(key: str) -> str:
    """A key's default tenant: named after its digest, so the key itself never appears."""
    return "key-" + _digest(key).hex()[:16]


def cache_namespace(tenant: str, cache_salt: str) -> str:
    """The prefix-cache namespace of a request: shared by requests of one tenant with the same
    salt, never across tenants. Anonymous unsalted requests share the default namespace ''."""
    if not tenant and not cache_salt:
        return ""
    return hashlib.sha256(f"{tenant}\0{cache_salt}".encode()).hexdigest()[:16]


class ApiKeyInterceptor(grpc.aio.ServerInterceptor):
    """Refuses a call without a valid key before its handler runs: UNAUTHENTICATED for a
    missing or wrong key, PERMISSION_DENIED for an operational method without the admin scope."""

    def __init__(self, keys: ApiKeys) -> None:
        self.keys = keys

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]],
        details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler:
        handler = await continuation(details)
        method = details.method or ""
        if not self.keys.enabled or handler is None or method.startswith(OPEN_PREFIXES):
            return handler
        who = self.keys.of_metadata(details.invocation_metadata)
        if who is None:
            return _refusal(
                handler,
                grpc.StatusCode.UNAUTHENTICATED,
                "missing or unknown API key: send `authorization: Bearer <key>`",
            )
        if method in ADMIN_METHODS and not who.admin:
            return _refusal(
                handler, grpc.StatusCode.PERMISSION_DENIED, f"{method} needs an admin API key"
            )
        return handler


def _refusal(
    handler: grpc.RpcMethodHandler, code: grpc.StatusCode, message: str
) -> grpc.RpcMethodHandler:
    """A handler of the same shape as `handler` that ends the call with `code`."""

    async def unary(request: Any, context: grpc.aio.ServicerContext) -> Any:
        await context.abort(code, message)

    async def stream(request: Any, context: grpc.aio.ServicerContext) -> Any:
        await context.abort(code, message)
        yield  # pragma: no cover - makes this an async generator

    codec = {
        "request_deserializer": handler.request_deserializer,
        "response_serializer": handler.response_serializer,
    }
    if handler.unary_unary:
        return grpc.unary_unary_rpc_method_handler(unary, **codec)
    if handler.unary_stream:
        return grpc.unary_stream_rpc_method_handler(stream, **codec)
    if handler.stream_unary:
        return grpc.stream_unary_rpc_method_handler(unary, **codec)
    return grpc.stream_stream_rpc_method_handler(stream, **codec)
