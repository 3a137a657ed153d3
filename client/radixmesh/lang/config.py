"""Process-wide defaults: the default backend and the ablation switches.

`global_config` is read when a program *starts* (run / run_batch / graph run): flipping a
switch never changes a program already running, which keeps ablation runs clean.
"""

from __future__ import annotations

import os
import threading
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from radixmesh.lang.backend import Backend

DEFAULT_ENDPOINT = "localhost:50051"
ENDPOINT_ENV = "RADIXMESH_ENDPOINT"


@dataclass
class GlobalConfig:
    """Switches for the paper's frontend ablations (Figure 8c).

    enable_fork_hint: send prefix-only requests (max_new_tokens=0) before fork branches,
        before select's choices, and once per run_batch for the traced constant prefix
        ("No Frontend Hint" when False).
    enable_parallelism: streams run on their own threads and run_batch runs programs
        concurrently; when False every op executes in program order on the caller's thread
        ("No Frontend Parallelism").
    default_num_threads: run_batch workers when num_threads="auto" (capped by batch size).
    """

    enable_fork_hint: bool = True
    enable_parallelism: bool = True
    default_num_threads: int = 64

    @property
    def default_backend(self) -> Backend | None:
        """SGLang's `global_config.default_backend`: the backend set so far (None if none)."""
        with _backend_lock:
            return _default_backend

    @default_backend.setter
    def default_backend(self, backend: Backend | None) -> None:
        set_default_backend(backend)


global_config = GlobalConfig()

_backend_lock = threading.Lock()
_default_backend: Backend | None = None


def default_endpoint() -> str:
    """`$RADIXMESH_ENDPOINT` if set, else what `radixmesh serve` listens on."""
    return os.environ.get(ENDPOINT_ENV) or DEFAULT_ENDPOINT


def set_default_backend(backend: Backend | None) -> None:
    """Backend used by programs run without `backend=`; None restores the lazy default."""
    global _default_backend
    with _backend_lock:
        _default_backend = backend


def get_default_backend() -> Backend:
    """The default backend, creating a gRPC one for `default_endpoint()` on first use."""
    global _default_backend
    with _backend_lock:
        if _default_backend is None:
            from radixmesh.lang.grpc_backend import GrpcBackend  # lazy: keeps import cheap

            _default_backend = GrpcBackend(default_endpoint())
        return _default_backend
