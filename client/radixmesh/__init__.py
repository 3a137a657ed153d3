"""RadixMesh client library: `import radixmesh as rm`.

The program DSL (SGLang-style) is re-exported here: `@rm.function`, `rm.gen`, `rm.select`,
`rm.system` / `rm.user` / `rm.assistant`, `rm.set_default_backend(rm.RuntimeEndpoint(...))`;
`rm.Client` / `rm.AsyncClient` are the plain gRPC clients (`radixmesh.api`; `rm.RetryPolicy`,
`rm.NO_RETRY`: how a broken stream is resumed). Dependencies: grpcio
and protobuf only.

Names load on first use, so `import radixmesh.api` (the CLI's client commands) does not load
the DSL.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

_API = ("AsyncClient", "Client", "GenerateResult", "RadixMeshError")
_RETRY = ("NO_RETRY", "RetryPolicy")

if TYPE_CHECKING:
    from radixmesh.api import AsyncClient as AsyncClient
    from radixmesh.api import Client as Client
    from radixmesh.api import GenerateResult as GenerateResult
    from radixmesh.api import RadixMeshError as RadixMeshError
    from radixmesh.lang import *  # noqa: F403
    from radixmesh.retry import NO_RETRY as NO_RETRY
    from radixmesh.retry import RetryPolicy as RetryPolicy


def __getattr__(name: str) -> Any:
    if name == "__all__":  # `from radixmesh import *`
        return __dir__()
    if name in _API:
        return getattr(importlib.import_module("radixmesh.api"), name)
    if name in _RETRY:
        return getattr(importlib.import_module("radixmesh.retry"), name)
    lang = importlib.import_module("radixmesh.lang")
    if name in lang.__all__:
        return getattr(lang, name)
    raise AttributeError(f"module 'radixmesh' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted([*_API, *_RETRY, *importlib.import_module("radixmesh.lang").__all__])
