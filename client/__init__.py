"""RadixMesh client library: `import client as rm`.

The program DSL (SGLang-style) is re-exported here: `@rm.function`, `rm.gen`, `rm.select`,
`rm.system` / `rm.user` / `rm.assistant`, `rm.set_default_backend(rm.RuntimeEndpoint(...))`.
`rm.Client` / `rm.AsyncClient` (plain gRPC clients) live in `client.api` and are loaded on
first use. Dependencies: grpcio and protobuf only.
"""

from __future__ import annotations

import importlib
from typing import Any

from client.lang import (
    DEFAULT_ENDPOINT,
    Backend,
    BackendBase,
    BackendError,
    BatchResult,
    ChoicesMethod,
    Completion,
    ForkGroup,
    GenParams,
    GreedyToken,
    GrpcBackend,
    LogprobRequest,
    ModelInfo,
    ProgramError,
    ProgramGraph,
    ProgramState,
    ProgramStats,
    RoleMarkers,
    RuntimeEndpoint,
    ScriptedBackend,
    SelectResult,
    SglFunction,
    TokenLengthNormalized,
    TokenLogprob,
    TracingError,
    UnconditionalNormalized,
    assistant,
    concat,
    default_endpoint,
    function,
    gen,
    get_default_backend,
    global_config,
    greedy_token,
    role_begin,
    role_end,
    select,
    set_default_backend,
    system,
    token_length_normalized,
    unconditional_normalized,
    user,
)

__all__ = [
    "DEFAULT_ENDPOINT",
    "Backend",
    "BackendBase",
    "BackendError",
    "BatchResult",
    "ChoicesMethod",
    "Completion",
    "ForkGroup",
    "GenParams",
    "GreedyToken",
    "GrpcBackend",
    "LogprobRequest",
    "ModelInfo",
    "ProgramError",
    "ProgramGraph",
    "ProgramState",
    "ProgramStats",
    "RoleMarkers",
    "RuntimeEndpoint",
    "ScriptedBackend",
    "SelectResult",
    "SglFunction",
    "TokenLengthNormalized",
    "TokenLogprob",
    "TracingError",
    "UnconditionalNormalized",
    "assistant",
    "concat",
    "default_endpoint",
    "function",
    "gen",
    "get_default_backend",
    "global_config",
    "greedy_token",
    "role_begin",
    "role_end",
    "select",
    "set_default_backend",
    "system",
    "token_length_normalized",
    "unconditional_normalized",
    "user",
    "AsyncClient",
    "Client",
]


def __getattr__(name: str) -> Any:
    # Lazy so that the DSL imports even while client.api is absent or being written.
    if name in ("Client", "AsyncClient"):
        return getattr(importlib.import_module("client.api"), name)
    raise AttributeError(f"module 'client' has no attribute {name!r}")
