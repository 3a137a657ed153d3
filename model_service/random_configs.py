"""Architectures that can be built with random weights (`--random-weights NAME`).

Random weights run at the speed of trained ones, so GPU benchmarks build the model on the device
instead of shipping 16 GB of weights (docs/architecture.md). Each name maps to an HF LlamaConfig;
the model folder that goes with it holds that config and a real tokenizer, so the tokenizer
service and HF transformers (the reference in checks) can load it like any model folder.

Names:
- `llama-3.1-8b`: Meta Llama-3.1-8B's architecture (its published config.json).
- `llama-3.1-70b`: Meta Llama-3.1-70B's architecture (its published config.json: 70.55 B
  parameters, 141 GB in bf16). It fits no single 80 GB GPU: the GPU bench's `startup` part uses
  it to check that the service refuses weights that do not fit before allocating them.
- `llama-3.2-1b`: Meta Llama-3.2-1B's architecture (its published config.json: 1.24 B
  parameters, tied embeddings, llama3 RoPE scaling with factor 32). Small enough that several
  replicas share one GPU (`radixmesh bench router`).
- `tiny-llama`: the same family in miniature (GQA, llama3 RoPE scaling, the Llama-3.1
  vocabulary) for quick tests on any device.
- `llava-1.5-7b`, `tiny-llava`, `llava-next-7b`, `tiny-llava-next`: LLaVA and LLaVA-NeXT shapes
  (vision tower + Llama), built by random_llava.py.
- `tiny-qwen2`: a Qwen2 in miniature (q/k/v biases, one KV head, tied embeddings, Qwen2's
  RoPE theta and 32,768-token context), for tests of the Qwen2 path, e.g. tensor parallelism
  with fewer KV heads than ranks.
Every shape keeps its published context length (Llama-3.1 and 3.2: 131,072), which is what
the service reports and the front door enforces; the KV pool is sized from memory
(`--kv-tokens` / `--kv-memory-gb` / `--kv-memory-fraction`), never from the context length.
Overrides (e.g. `num_hidden_layers=4` for a fast numerics check with 8B shapes) go through
`random_config(name, tokenizer_dir, **overrides)` or a name suffix `NAME:key=value,key=value`.

The default tokenizer is the real Llama-3.1 one, committed gzip-compressed under
`model_service/assets/llama3_1_tokenizer/` and unpacked once into the project cache.
"""

from __future__ import annotations

import gzip
import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

from model_service.random_llava import SHAPES as LLAVA_SHAPES
from model_service.random_llava import random_llava_config
from services.model_store import ModelError, cache_root

ASSET_DIR = Path(__file__).parent / "assets" / "llama3_1_tokenizer"
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json")

_LLAMA31_ROPE = {
    "rope_type": "llama3",
    "factor": 8.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 8192,
}

# Field values as in meta-llama/Llama-3.1-8B(-Instruct)/config.json; eos ids are the Instruct
# model's (<|end_of_text|>, <|eom_id|>, <|eot_id|>).
_LLAMA31_8B: dict[str, Any] = {
    "vocab_size": 128256,
    "hidden_size": 4096,
    "intermediate_size": 14336,
    "num_hidden_layers": 32,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "head_dim": 128,
    "hidden_act": "silu",
    "max_position_embeddings": 131072,
    "rms_norm_eps": 1e-5,
    "rope_theta": 500000.0,
    "rope_scaling": _LLAMA31_ROPE,
    "attention_bias": False,
    "mlp_bias": False,
    "tie_word_embeddings": False,
    "bos_token_id": 128000,
    "eos_token_id": [128001, 128008, 128009],
    "initializer_range": 0.02,
}

CONFIGS: dict[str, dict[str, Any]] = {
    "llama-3.1-8b": _LLAMA31_8B,
    # meta-llama/Llama-3.1-70B(-Instruct)/config.json; same RoPE scaling, vocabulary and eos ids
    "llama-3.1-70b": {
        **_LLAMA31_8B,
        "hidden_size": 8192,
        "intermediate_size": 28672,
        "num_hidden_layers": 80,
        "num_attention_heads": 64,
    },
    # meta-llama/Llama-3.2-1B(-Instruct)/config.json: same vocabulary, theta and eos ids as 3.1;
    # its RoPE scaling factor is 32 (3.1: 8) and the output head shares the embedding table.
    "llama-3.2-1b": {
        **_LLAMA31_8B,
        "hidden_size": 2048,
        "intermediate_size": 8192,
        "num_hidden_layers": 16,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
        "head_dim": 64,
        "rope_scaling": {**_LLAMA31_ROPE, "factor": 32.0},
        "tie_word_embeddings": True,
    },
    "tiny-llama": {
        **_LLAMA31_8B,
        "hidden_size": 256,
        "intermediate_size": 512,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 64,
    },
    # Qwen2-0.5B's family traits at tiny-llama's size.
    "tiny-qwen2": {
        "model_type": "qwen2",
        "vocab_size": 128256,
        "hidden_size": 256,
        "intermediate_size": 512,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 1,
        "head_dim": 64,
        "hidden_act": "silu",
        "max_position_embeddings": 32768,
        "rms_norm_eps": 1e-6,
        "rope_theta": 1000000.0,
        "rope_scaling": None,
        "tie_word_embeddings": True,
        "use_sliding_window": False,
        "bos_token_id": 128000,
        "eos_token_id": [128001, 128008, 128009],
        "initializer_range": 0.02,
    },
}


def parse_name(spec: str) -> tuple[str, dict[str, Any]]:
    """'llama-3.1-8b:num_hidden_layers=4' -> ('llama-3.1-8b', {'num_hidden_layers': 4})."""
    name, _, rest = spec.partition(":")
    overrides: dict[str, Any] = {}
    for item in filter(None, (p.strip() for p in rest.split(","))):
        key, eq, value = item.partition("=")
        if not eq:
            raise ModelError(f"random weights override {item!r}: expected key=value")
        overrides[key.strip()] = json.loads(value)
    return name.strip(), overrides


def config_dict(spec: str, **overrides: Any) -> dict[str, Any]:
    name, from_name = parse_name(spec)
    if name not in CONFIGS:
        raise ModelError(
            f"--random-weights {name!r}: unknown architecture; "
            f"choose one of {', '.join(sorted(CONFIGS))}"
        )
    fields = dict(CONFIGS[name])
    for key, value in {**from_name, **overrides}.items():
        if key not in fields:
            raise ModelError(f"random weights override {key!r} is not a field of {name}")
        fields[key] = value
    return fields


def hf_config(fields: dict[str, Any]):  # type: ignore[no-untyped-def]
    """An HF LlamaConfig from our field dict (rope fields passed the way this transformers
    version takes them: `rope_parameters` in 5.x, `rope_theta` + `rope_scaling` before)."""
    import inspect

    from transformers import LlamaConfig, Qwen2Config

    kw = dict(fields)
    qwen = kw.pop("model_type", "llama") == "qwen2"
    config_cls = Qwen2Config if qwen else LlamaConfig
    theta, scaling = kw.pop("rope_theta"), kw.pop("rope_scaling") or {"rope_type": "default"}
    if "rope_parameters" in inspect.signature(config_cls.__init__).parameters:
        kw["rope_parameters"] = {**scaling, "rope_theta": theta}
    else:
        kw["rope_theta"] = theta
        kw["rope_scaling"] = dict(scaling) if scaling.get("rope_type") != "default" else None
    cfg = config_cls(**kw)
    cfg.architectures = ["Qwen2ForCausalLM" if qwen else "LlamaForCausalLM"]
    return cfg


def _unpack_asset(dest: Path) -> None:
    """Decompress the bundled tokenizer into dest (atomically: concurrent starts never see half
    a folder)."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix="unpack-", dir=dest.parent))
    try:
        for name in TOKENIZER_FILES:
            src = ASSET_DIR / f"{name}.gz"
            if not src.exists():
                raise ModelError(
                    f"{src} is missing: the bundled Llama-3.1 tokenizer is "
                    "incomplete (see model_service/assets/llama3_1_tokenizer/"
                    "SOURCE.md to rebuild it)"
                )
            with gzip.open(src, "rb") as f_in, (tmp / name).open("wb") as f_out:
                shutil.copyfileobj(f_in, f_out)
        try:
            os.replace(tmp, dest)
        except OSError:  # another process won the race
            if not (dest / TOKENIZER_FILES[0]).exists():
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def bundled_tokenizer_dir() -> Path:
    """The real Llama-3.1 tokenizer (vocab 128256), unpacked on first use into the cache."""
    dest = cache_root() / "tokenizers" / "llama3_1"
    if not all((dest / n).exists() for n in TOKENIZER_FILES):
        _unpack_asset(dest)
    return dest


def random_config(name: str, tokenizer_dir: str | Path = "", **overrides: Any) -> tuple[Any, Path]:
    """(HF LlamaConfig, model folder) for `--random-weights name`.

    The folder (under the project cache) holds config.json and the tokenizer files, so it
    loads with AutoConfig / AutoTokenizer. `tokenizer_dir` replaces the bundled Llama-3.1
    tokenizer; its vocabulary must fit the architecture's embedding table.
    """
    tok = Path(tokenizer_dir).expanduser() if tokenizer_dir else bundled_tokenizer_dir()
    base, extra = parse_name(name)
    if base in LLAVA_SHAPES:  # a LlavaConfig and its folder (random_llava.py)
        if extra or overrides:
            raise ModelError(f"--random-weights {base}: LLaVA shapes take no overrides")
        folder = cache_root() / "random" / base
        return random_llava_config(base, folder, tok), folder
    fields = config_dict(name, **overrides)
    cfg = hf_config(fields)
    files = (
        [p for p in tok.iterdir() if p.is_file() and p.name != "config.json"]
        if tok.is_dir()
        else []
    )
    if not any(p.name in ("tokenizer.json", "tokenizer.model", "vocab.json") for p in files):
        raise ModelError(f"--tokenizer {tok}: no tokenizer.json / tokenizer.model there")
    _check_vocab(tok, fields["vocab_size"])
    key = name.replace("/", "_").replace(":", "_").replace(",", "_").replace("=", "-")
    if overrides:
        key += "_" + "_".join(f"{k}-{v}" for k, v in sorted(overrides.items()))
    model_dir = cache_root() / "random" / key
    model_dir.mkdir(parents=True, exist_ok=True)
    for p in files:
        target = model_dir / p.name
        if not target.exists() or target.stat().st_size != p.stat().st_size:
            shutil.copyfile(p, target)
    cfg_json = cfg.to_dict()
    cfg_json["_name_or_path"] = f"random-{name}"
    text = json.dumps(cfg_json, indent=2, sort_keys=True, default=str)
    cfg_path = model_dir / "config.json"
    if not cfg_path.exists() or cfg_path.read_text() != text:
        cfg_path.write_text(text)
    cfg._name_or_path = f"random-{name}"
    return cfg, model_dir


def _check_vocab(tok: Path, vocab_size: int) -> None:
    """A tokenizer whose ids exceed the embedding table would index out of range on the GPU."""
    path = tok / "tokenizer.json"
    if not path.exists():
        return
    data = json.loads(path.read_text(encoding="utf-8"))
    ids = list((data.get("model") or {}).get("vocab", {}).values())
    ids += [t["id"] for t in data.get("added_tokens", [])]
    if ids and max(ids) >= vocab_size:
        raise ModelError(
            f"tokenizer {tok} has ids up to {max(ids)}, more than the model's "
            f"vocabulary of {vocab_size}"
        )


if __name__ == "__main__":  # `radixmesh serve --random-weights NAME`: the shape's folder
    import sys

    print(random_config(sys.argv[1])[1])
