"""SGLang's module path `sglang.lang.backend.openai`: `OpenAI`, the backend of an
OpenAI-compatible server (`radixmesh.lang.openai_backend`)."""

from __future__ import annotations

from radixmesh.lang.openai_backend import OpenAI, OpenAIBackend

__all__ = ["OpenAI", "OpenAIBackend"]
