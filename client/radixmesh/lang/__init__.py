"""RadixMesh's SGLang-style program DSL (see docs/dsl.md).

Interpreter mode: `@function` programs append text and primitives to a prompt state `s`;
each state is an asynchronous stream. Compiler mode: `prog.trace()` gives a `ProgramGraph`.
"""

from __future__ import annotations

from radixmesh.lang.backend import (
    Backend,
    BackendBase,
    BaseBackend,
    Completion,
    LogprobRequest,
    ModelInfo,
    RoleMarkers,
    TokenLogprob,
    TokenUsage,
)
from radixmesh.lang.chat_template import ChatTemplate, get_chat_template
from radixmesh.lang.choices import (
    ChoicesDecision,
    ChoicesMethod,
    ChoicesSamplingMethod,
    GreedyToken,
    GreedyTokenSelection,
    TokenLengthNormalized,
    UnconditionalLikelihoodNormalized,
    UnconditionalNormalized,
    greedy_token,
    greedy_token_selection,
    token_length_normalized,
    unconditional_likelihood_normalized,
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
from radixmesh.lang.meta import MetaInfo
from radixmesh.lang.openai_backend import OpenAI, OpenAIBackend
from radixmesh.lang.params import GenParams
from radixmesh.lang.primitives import (
    REGEX_BOOL,
    REGEX_FLOAT,
    REGEX_INT,
    REGEX_STR,
    assistant,
    assistant_begin,
    assistant_end,
    concat,
    gen,
    gen_int,
    gen_string,
    image,
    role_begin,
    role_end,
    select,
    separate_reasoning,
    system,
    system_begin,
    system_end,
    user,
    user_begin,
    user_end,
)
from radixmesh.lang.scoring import SelectResult
from radixmesh.lang.scripted import ScriptedBackend
from radixmesh.lang.state import ForkGroup, ProgramState
from radixmesh.lang.stats import ProgramStats

__all__ = [
    "REGEX_BOOL",
    "REGEX_FLOAT",
    "REGEX_INT",
    "REGEX_STR",
    "BaseBackend",
    "ChatTemplate",
    "ChoicesDecision",
    "ChoicesSamplingMethod",
    "GreedyTokenSelection",
    "MetaInfo",
    "OpenAI",
    "OpenAIBackend",
    "UnconditionalLikelihoodNormalized",
    "assistant_begin",
    "assistant_end",
    "gen_int",
    "gen_string",
    "get_chat_template",
    "greedy_token_selection",
    "image",
    "separate_reasoning",
    "system_begin",
    "system_end",
    "unconditional_likelihood_normalized",
    "user_begin",
    "user_end",
    "DEFAULT_ENDPOINT",
    "Backend",
    "BackendBase",
    "TokenUsage",
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
