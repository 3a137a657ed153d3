"""RadixMesh's SGLang-style program DSL (see docs/dsl.md).

Interpreter mode: `@function` programs append text and primitives to a prompt state `s`;
each state is an asynchronous stream. Compiler mode: `prog.trace()` gives a `ProgramGraph`.
"""

from __future__ import annotations

from radixmesh.lang.backend import (
    Backend,
    BackendBase,
    Completion,
    LogprobRequest,
    ModelInfo,
    RoleMarkers,
    TokenLogprob,
)
from radixmesh.lang.choices import (
    ChoicesMethod,
    GreedyToken,
    TokenLengthNormalized,
    UnconditionalNormalized,
    greedy_token,
    token_length_normalized,
    unconditional_normalized,
)
from radixmesh.lang.compiler import ProgramGraph
from radixmesh.lang.config import (
    DEFAULT_ENDPOINT,
    default_endpoint,
    get_default_backend,
    global_config,
    set_default_backend,
)
from radixmesh.lang.errors import BackendError, ProgramError, TracingError
from radixmesh.lang.function import BatchResult, SglFunction, function
from radixmesh.lang.grpc_backend import GrpcBackend, RuntimeEndpoint
from radixmesh.lang.params import GenParams
from radixmesh.lang.primitives import (
    assistant,
    concat,
    gen,
    role_begin,
    role_end,
    select,
    system,
    user,
)
from radixmesh.lang.scoring import SelectResult
from radixmesh.lang.scripted import ScriptedBackend
from radixmesh.lang.state import ForkGroup, ProgramState
from radixmesh.lang.stats import ProgramStats

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
