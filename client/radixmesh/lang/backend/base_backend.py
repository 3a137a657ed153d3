"""SGLang's module path `sglang.lang.backend.base_backend`: `BaseBackend`, the backend base
class (RadixMesh's `BackendBase`; see `radixmesh.lang.backend` for the contract)."""

from __future__ import annotations

from radixmesh.lang.backend import BaseBackend

__all__ = ["BaseBackend"]
