"""Shared pieces of the GPU benchmark: environment record, copy bandwidth, JSON, model builders.

Every part writes one JSON document:

    {"schema": 1, "part": NAME, "device": ..., "date": ..., "versions": {...},
     "copy_bandwidth_GBps": ..., "rows": [ROW, ...], "notes": [...], "errors": [...]}

A performance ROW names `system` (radixmesh, hf-transformers), `variant`, `path` (in-process
now; "grpc-stack" for through-the-stack runs later), the workload (`batch`, `input_len`,
`output_len`) and its figures (`tok_s`, `decode_step_ms_median`, `roofline_fraction`, ...).
A numerics ROW (part `check`) carries `rel_err` and friends. radixmesh_bench/gpu/merge.py turns any
set of these documents into markdown tables.
"""

from __future__ import annotations

import datetime as dt
import json
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import torch

SCHEMA = 1
ROOT = Path(__file__).resolve().parents[2]


def versions() -> dict[str, str]:
    out = {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "cuda": str(torch.version.cuda),
    }
    for mod in ("transformers", "flashinfer"):
        try:
            out[mod] = __import__(mod).__version__
        except Exception as exc:  # missing, or broken
            out[mod] = f"unavailable ({type(exc).__name__})"
    return out


def device_name() -> str:
    if torch.cuda.is_available():
        p = torch.cuda.get_device_properties(0)
        return f"{p.name} ({p.total_memory / 2**30:.0f} GiB, {p.multi_processor_count} SMs)"
    return f"cpu ({platform.processor() or platform.machine()})"


def new_doc(part: str) -> dict[str, Any]:
    return {
        "schema": SCHEMA,
        "part": part,
        "device": device_name(),
        "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "versions": versions(),
        "host": platform.node(),
        "rows": [],
        "notes": [],
        "errors": [],
    }


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def copy_bandwidth_gbps(mib: int = 1024, reps: int = 20) -> float:
    """Device-to-device copy rate counting bytes read plus written (METHOD.md), median of
    `reps` timed copies of a `mib` MiB buffer after warm-up."""
    n = mib << 20
    a = torch.randint(0, 255, (n,), dtype=torch.uint8, device="cuda")
    b = torch.empty_like(a)
    for _ in range(3):
        b.copy_(a)
    times = []
    for _ in range(reps):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        b.copy_(a)
        e.record()
        e.synchronize()
        times.append(s.elapsed_time(e) / 1e3)
    del a, b
    torch.cuda.empty_cache()
    return 2 * n / statistics.median(times) / 1e9


def percentile(xs: list[float], q: float) -> float:
    if not xs:
        return float("nan")
    s = sorted(xs)
    k = min(len(s) - 1, max(0, round(q * (len(s) - 1))))
    return s[k]


def strict_fp32() -> None:
    """fp32 references must be real fp32 (no TF32 in matmuls or convolutions)."""
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.set_float32_matmul_precision("highest")


def hf_model(hf_cfg: Any, dtype: torch.dtype, device: str = "cuda", attn: str = "sdpa") -> Any:
    """HF transformers' LlamaForCausalLM built directly in `dtype` on `device` (its own random
    init; load a state dict on top for shared weights). Building under a default dtype, as
    from_pretrained(dtype=...) does, keeps HF's RoPE buffers in fp32."""
    from transformers import LlamaForCausalLM as HFLlama

    hf_cfg._attn_implementation = attn
    prev = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with torch.device(device):
            model = HFLlama(hf_cfg)
    finally:
        torch.set_default_dtype(prev)
    return model.eval()


def replay_ms(graph: Any, reps: int = 30) -> float:
    """Median GPU time of one replay of a captured CUDA graph (CUDA events around each)."""
    times = []
    for _ in range(reps):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        graph.replay()
        e.record()
        e.synchronize()
        times.append(s.elapsed_time(e))
    return statistics.median(times)


def log_tails(log_dir: Path, chars: int = 1500) -> list[str]:
    """The last `chars` of each service's log under `log_dir` (a failed stack run), as notes
    for the JSON document; also printed to stderr for the device log."""
    notes = []
    for name in ("model", "scheduler", "tokenizer", "grammar"):
        p = log_dir / f"{name}.log"
        if p.exists():
            tail = p.read_text(errors="replace")[-chars:]
            notes.append(f"{name}.log tail: {tail}")
            print(f"--- {name}.log tail\n{tail}", file=sys.stderr, flush=True)
    return notes


def hf_generate_timed(
    model: Any, ids: torch.Tensor, mask: torch.Tensor, n: int
) -> tuple[float, int]:
    """One greedy HF `generate` of exactly `n` new tokens (EOS off): (seconds, tokens made)."""

    def sync() -> None:
        if ids.device.type == "cuda":
            torch.cuda.synchronize(ids.device)

    sync()
    t0 = time.perf_counter()
    with torch.inference_mode():
        out = model.generate(
            input_ids=ids,
            attention_mask=mask,
            max_new_tokens=n,
            min_new_tokens=n,
            do_sample=False,
            eos_token_id=None,
            pad_token_id=0,
        )
    sync()
    return time.perf_counter() - t0, int(out.shape[1] - ids.shape[1])


def ours_from_state(
    args: Any,
    state: dict[str, torch.Tensor],
    dtype: torch.dtype,
    device: str = "cuda",
    fuse: bool = True,
) -> Any:
    """Our LlamaForCausalLM holding `state` (HF names) cast to `dtype`, fused as the model
    service fuses it on CUDA unless `fuse` is False; RoPE frequencies in fp32."""
    from model_service.models.llama import LlamaForCausalLM, rope_inv_freq

    with torch.device("meta"):
        model = LlamaForCausalLM(args)
    cast = {k: v.detach().to(device=device, dtype=dtype).clone() for k, v in state.items()}
    missing, unexpected = model.load_state_dict(cast, strict=False, assign=True)
    if missing or unexpected:
        raise RuntimeError(f"state mismatch: missing {missing[:3]}, unexpected {unexpected[:3]}")
    model.inv_freq = rope_inv_freq(args).to(device)
    if fuse:
        model.fuse()
    return model.eval()


def json_worker(
    cmd: list[str], out: Path, timeout: float, what: str, env: dict[str, str] | None = None
) -> dict[str, Any]:
    """Run a worker process that writes its result to `out` as JSON (from the repository root,
    at most `timeout` s): the result with `worker_wall_s`, or {"error": ...} naming `what`."""
    t = time.perf_counter()
    try:
        rc: int | str = subprocess.run(cmd, timeout=timeout, cwd=ROOT, env=env).returncode
    except subprocess.TimeoutExpired:
        rc = "timeout"
    if rc != 0 or not out.exists():
        return {"error": f"{what} exited with {rc} after {time.perf_counter() - t:.0f}s"}
    res: dict[str, Any] = json.loads(out.read_text())
    res["worker_wall_s"] = time.perf_counter() - t
    return res
