"""What all streams of one program share: backend, sampling defaults, stats and switches."""

from __future__ import annotations

import threading
from dataclasses import dataclass, field

from radixmesh.lang.backend import Backend, TokenUsage
from radixmesh.lang.config import global_config
from radixmesh.lang.params import GenParams
from radixmesh.lang.roles import RoleRenderer
from radixmesh.lang.stats import ProgramStats


def usage_of(backend: Backend) -> TokenUsage | None:
    """The backend's `token_usage` (BaseBackend has one), None for a backend without."""
    usage = getattr(backend, "token_usage", None)
    return usage if isinstance(usage, TokenUsage) else None


@dataclass
class ProgramContext:
    """What all streams of one program share; fixed when the program starts."""

    backend: Backend
    defaults: GenParams = field(default_factory=GenParams)
    stats: ProgramStats = field(default_factory=ProgramStats)
    stream: bool = False
    parallel: bool = True
    hint: bool = True
    spec_tokens: int | None = None  # API speculative execution (speculation.py) when set
    _renderer: RoleRenderer | None = None
    _lock: threading.Lock = field(default_factory=threading.Lock)

    @classmethod
    def create(
        cls,
        backend: Backend,
        defaults: GenParams | None = None,
        *,
        stream: bool = False,
        spec_tokens: int | None = None,
    ) -> ProgramContext:
        """A context with the ablation switches of `global_config` as of now."""
        if spec_tokens is not None and stream:
            raise ValueError("stream=True cannot be combined with num_api_spec_tokens")
        return cls(
            backend,
            defaults or GenParams(),
            stats=ProgramStats(usage_of(backend)),
            stream=stream,
            parallel=global_config.enable_parallelism,
            hint=global_config.enable_fork_hint,
            spec_tokens=spec_tokens,
        )

    def renderer(self) -> RoleRenderer:
        with self._lock:
            if self._renderer is None:
                self._renderer = RoleRenderer(self.backend.model_info())
            return self._renderer
