"""RadixMesh's SGLang-style program DSL (see docs/dsl.md).

Interpreter mode: `@function` programs append text and primitives to a prompt state `s`;
each state is an asynchronous stream. Compiler mode: `prog.trace()` gives a `ProgramGraph`.
"""

from __future__ import annotations

from client.lang.backend import (
    Backend,
    BackendBase,
    Completion,
    LogprobRequest,
    ModelInfo,
    RoleMarkers,
    TokenLogprob,
)
from client.lang.choices import (
    ChoicesMethod,
    GreedyToken,
    TokenLengthNormalized,
    UnconditionalNormalized,
    greedy_token,
    token_length_normalized,
    unconditional_normalized,
)
from client.lang.compiler import ProgramGraph
from client.lang.config import (
    DEFAULT_ENDPOINT,
    default_endpoint,
    get_default_backend,
    global_config,
    set_default_backend,
)
from client.lang.errors import BackendError, ProgramError, TracingError
from client.lang.function import BatchResult, SglFunction, function
from client.lang.grpc_backend import GrpcBackend, RuntimeEndpoint
from client.lang.params import GenParams
from client.lang.primitives import (
    assistant,
    concat,
    gen,
    role_begin,
    role_end,
    select,
    system,
    user,
)
from client.lang.scoring import SelectResult
from client.lang.scripted import ScriptedBackend
from client.lang.state import ForkGroup, ProgramState
from client.lang.stats import ProgramStats

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
]
