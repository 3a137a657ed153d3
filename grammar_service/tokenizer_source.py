"""Where the grammar service's tokenizer comes from: a folder, "default" (the embedded model's
converted folder from services.model_store, which holds its tokenizer), or a loaded object.
RADIXMESH_GRAMMAR_TOKENIZER overrides the default folder."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from services.model_store import resolve_model

TOKENIZER_ENV = "RADIXMESH_GRAMMAR_TOKENIZER"


def default_tokenizer_dir() -> Path:
    override = os.environ.get(TOKENIZER_ENV)
    return Path(override) if override else resolve_model("default")


def load_tokenizer(source: str | Path | Any) -> Any:
    """A Hugging Face tokenizer from a folder, "default", or an already loaded tokenizer."""
    if not isinstance(source, str | Path):
        return source
    from transformers import AutoTokenizer

    if str(source) in ("", "default"):
        source = default_tokenizer_dir()
    return AutoTokenizer.from_pretrained(str(source))
