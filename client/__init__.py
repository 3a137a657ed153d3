"""RadixMesh client library: `import client as rm`.

The program DSL (SGLang-style) is re-exported here: `@rm.function`, `rm.gen`, `rm.select`,
`rm.system` / `rm.user` / `rm.assistant`, `rm.set_default_backend(rm.RuntimeEndpoint(...))`;
`rm.Client` / `rm.AsyncClient` are the plain gRPC clients (`client.api`). Dependencies: grpcio
and protobuf only.
"""

from __future__ import annotations

from client import lang as _lang
from client.api import AsyncClient, Client, GenerateResult, RadixMeshError
from client.lang import *  # noqa: F403 - the DSL's public names, listed in client.lang.__all__

__all__ = [*_lang.__all__, "AsyncClient", "Client", "GenerateResult", "RadixMeshError"]
