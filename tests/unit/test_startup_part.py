"""The pieces of the GPU part `startup` (radixmesh_bench/gpu/startup_part.py) that run without a
GPU: the 70B random config, the KV check made before the weights, the messages the GPU cases expect
(produced here by the real preflight functions with the CUDA memory probe monkeypatched), the
unsupported-architecture cases through the real `python -m model_service`, the flashinfer
shadow, the log parsing and the judges, and merge.py's table."""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

from model_service import preflight
from model_service.models.llama import LlamaArgs, LlamaForCausalLM
from model_service.random_configs import config_dict, hf_config
from radixmesh_bench.gpu import merge
from radixmesh_bench.gpu import startup_cases as sc
from radixmesh_bench.gpu import startup_part as sp
from services.model_store import ModelError

ROOT = Path(__file__).resolve().parents[2]
GIB = 1 << 30
H100_FREE = (79 * GIB + GIB // 4, 80 * GIB - GIB // 4)  # what mem_get_info says on an idle H100


def args_of(spec: str) -> LlamaArgs:
    return LlamaArgs.from_hf_config(hf_config(config_dict(spec)))


def gpu_case(tmp_path: Path, name: str) -> sc.Case:
    return {c.name: c for c in sc.failure_cases(tmp_path, "cuda")}[name]


@pytest.fixture
def h100(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device=None: H100_FREE)


# -- the 70B config ---------------------------------------------------------------------------
def test_llama_70b_config_has_the_published_shape_and_parameter_count() -> None:
    a = args_of("llama-3.1-70b")
    assert (a.hidden_size, a.num_layers, a.num_heads, a.num_kv_heads) == (8192, 80, 64, 8)
    assert (a.intermediate_size, a.vocab_size, a.head_dim) == (28672, 128256, 128)
    assert a.rope_scaling is not None
    assert a.rope_scaling["rope_type"] == "llama3" and a.rope_scaling["factor"] == 8.0
    assert a.max_position == 131072 and not a.tie_word_embeddings
    n = preflight.param_count(a)
    assert n == 70_553_706_496  # Meta's Llama-3.1-70B: "70.6B" parameters
    assert round(n / 1e9, 1) == 70.6
    # param_count agrees with the module itself (2 layers of the 70B shape, on meta)
    cut = args_of("llama-3.1-70b:num_hidden_layers=2")
    with torch.device("meta"):
        model = LlamaForCausalLM(cut)
    assert preflight.param_count(cut) == sum(p.numel() for p in model.parameters())
    preflight.check_architecture(hf_config(config_dict("llama-3.1-70b")))


def test_70b_does_not_fit_an_80gb_gpu_even_in_bf16(tmp_path: Path, h100: None) -> None:
    a, cuda = args_of("llama-3.1-70b"), torch.device("cuda")
    assert preflight.weight_load_bytes(a, torch.bfloat16, cuda, random=False) > 140e9
    with pytest.raises(ModelError) as exc:
        preflight.check_weights_fit(a, torch.bfloat16, cuda, "random-llama-3.1-70b", random=True)
    msg = str(exc.value)
    assert "built in float32, then cast" in msg
    # the GPU case's expectations hold for the message the real check writes
    assert sc.judge_message(msg, gpu_case(tmp_path, "weights_too_big")) == []
    # and the 8B that the KV cases use does fit (they must get past this check)
    preflight.check_weights_fit(
        args_of("llama-3.1-8b"), torch.bfloat16, cuda, "random-llama-3.1-8b", random=True
    )


# -- the KV check before the weights ----------------------------------------------------------
def kv_precheck(a: LlamaArgs, device: str, **kw: Any) -> None:
    opts: dict[str, Any] = {
        "kv_tokens": 0,
        "kv_memory_fraction": 0.85,
        "kv_memory_gb": 0.5,
        "min_tokens": 0,
    }
    opts.update(kw)
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    preflight.check_kv_before_weights(a, dtype, torch.device(device), **opts)


def test_kv_before_weights_on_an_h100(tmp_path: Path, h100: None) -> None:
    a = args_of("llama-3.1-8b")
    kv_precheck(a, "cuda")  # the defaults serve: about 54 GiB of KV
    kv_precheck(a, "cuda", min_tokens=400_000)
    cases: list[tuple[str, dict[str, Any], int]] = [
        ("kv_min_tokens", {"min_tokens": 1_000_000}, 1_000_000),
        ("kv_fraction", {"kv_memory_fraction": 0.001}, 4096),
    ]
    for name, kw, needed in cases:
        with pytest.raises(ModelError) as exc:
            kv_precheck(a, "cuda", **kw)
        msg = str(exc.value)
        assert sc.judge_message(msg, gpu_case(tmp_path, name)) == [], msg
        fig = sc.kv_figures(msg)
        assert fig["kv_tokens_needed"] == needed and fig["kv_bytes_per_token"] == 131072
        assert 0 < fig["kv_tokens_fit"] < needed
    # the bound: (free - 8.03 B x 2 B) x 0.001 / 128 KiB
    free_after = H100_FREE[0] - preflight.param_count(a) * 2
    with pytest.raises(ModelError, match=rf"holds {int(free_after * 0.001) // 131072} tokens"):
        kv_precheck(a, "cuda", kv_memory_fraction=0.001)
    kv_precheck(a, "cuda", kv_tokens=1000, min_tokens=1_000_000)  # --kv-tokens skips it


def test_kv_before_weights_on_cpu_matches_the_later_check() -> None:
    a = args_of("tiny-llama")  # 2 x 2 x 64 x 2 x 4 B = 2048 B per token
    kv_precheck(a, "cpu", kv_memory_gb=0.01)  # 5120 tokens >= 4096
    with pytest.raises(ModelError, match="1.0 MiB \\(--kv-memory-gb 0.0009765625\\) holds 512 "):
        kv_precheck(a, "cpu", kv_memory_gb=1 / 1024)


def test_kv_before_weights_skips_where_free_memory_is_unknown(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(preflight, "free_memory", lambda device: None)
    kv_precheck(args_of("llama-3.1-8b"), "cuda", min_tokens=10**9)


# -- the cases as processes on CPU ------------------------------------------------------------
@pytest.mark.integration  # starts the model service
@pytest.mark.slow  # a real start-up per case: the longest of these tests
@pytest.mark.parametrize("name", ["arch_gelu", "arch_mixtral"])
def test_architecture_cases_through_the_real_service_on_cpu(tmp_path: Path, name: str) -> None:
    case = {c.name: c for c in sc.failure_cases(tmp_path, "cpu")}[name]
    row = sp.run_failing_start(case, "cpu", {**os.environ})
    assert row["returncode"] == 2, row
    assert row["pass"], row["problems"]
    assert row["table"] == "startup" and row["wall_s"] < case.max_wall_s


def test_gpu_architecture_case_expectations_match_the_checks(tmp_path: Path) -> None:
    """The GPU cases' folders, through the same calls the service makes before any weights."""
    from model_service.weights import load_hf_config
    from services.model_store import resolve_model

    gelu, mixtral = gpu_case(tmp_path, "arch_gelu"), gpu_case(tmp_path, "arch_mixtral")
    with pytest.raises(ModelError) as exc:
        preflight.check_architecture(load_hf_config(resolve_model(gelu.args[1])))
    assert sc.judge_message(str(exc.value), gelu) == []
    with pytest.raises(ModelError) as exc:
        resolve_model(mixtral.args[1])
    assert sc.judge_message(str(exc.value), mixtral) == []


# -- the flashinfer shadow --------------------------------------------------------------------
SHADOW_PROBE = """
import torch
torch.cuda.is_available = lambda: True  # as on the GPU machine: only the import can fail
from model_service.attention.flashinfer import flashinfer_available
print(repr(flashinfer_available()))
"""


@pytest.mark.integration  # starts a process
def test_flashinfer_shadow_makes_flashinfer_unavailable_with_its_reason(tmp_path: Path) -> None:
    shadow = sc.write_flashinfer_shadow(tmp_path / "shadow")
    env = sc.shadow_env({**os.environ, "PYTHONPATH": str(ROOT)}, shadow)
    assert env["PYTHONPATH"].split(os.pathsep)[:2] == [str(shadow), str(ROOT)]
    proc = subprocess.run(
        [sys.executable, "-c", SHADOW_PROBE],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    ok, reason = ast.literal_eval(proc.stdout.strip())  # a (bool, str) repr
    assert ok is False
    assert "flashinfer does not import" in reason and "ImportError" in reason
    assert sc.SHADOW_REASON in reason  # the shadow, not a missing install, is what failed


def test_shadow_env_without_a_pythonpath() -> None:
    env = sc.shadow_env({"HOME": "/h"}, Path("/s"))
    assert env == {"HOME": "/h", "PYTHONPATH": "/s"}


# -- log parsing and judges -------------------------------------------------------------------
FAILED = (
    "timestamp='2026-11-23T18:24:52Z' level='error' service='model' event='startup_failed' "
    "error=\"unsupported model architecture: hidden_act 'gelu'. Supported: x\""
)
FALLBACK = (
    "timestamp='t' level='warning' service='model' event='attention_fallback' reason=\"flashinfer"
    " unavailable (flashinfer does not import: ImportError('flashinfer hidden')); using the "
    'reference attention"'
)
READY = "timestamp='t' level='info' service='model' event='engine_ready' attention='reference'"


def test_log_parsing() -> None:
    assert sc.startup_failed_message("noise\n" + FAILED + "\n") == (
        "unsupported model architecture: hidden_act 'gelu'. Supported: x"
    )
    assert sc.startup_failed_message("no such line") is None
    assert "ImportError('flashinfer hidden')" in (sc.fallback_reason(FALLBACK) or "")
    assert sc.fallback_reason(READY) is None
    assert sc.engine_attention(FALLBACK + "\n" + READY) == "reference"
    assert sc.kv_figures("holds 65 tokens at 16384 B each, fewer than the 4096 tokens") == {
        "kv_tokens_fit": 65,
        "kv_bytes_per_token": 16384,
        "kv_tokens_needed": 4096,
    }
    assert sc.common_prefix([1, 2, 3], [1, 2, 4]) == 2


def test_judge_failure_names_each_problem() -> None:
    case = sc.Case("c", "what", [], ["hidden_act 'gelu'", "Supported"], [r"Supported: \w"], 10)
    msg = sc.startup_failed_message(FAILED)
    assert sc.judge_failure(case, 2, 3.0, FAILED, msg) == []
    bad = sc.judge_failure(case, 1, 30.0, "Traceback\n" + FAILED + "\n" + FAILED, "other")
    assert bad[:4] == [
        "exit code 1, expected 2",
        "took 30.0s, more than 10s",
        "a traceback in the output",
        "more than one startup_failed line",
    ]
    assert "text \"hidden_act 'gelu'\"" in bad[4]
    assert sc.judge_message(None, case) == ["no startup_failed line"]


def fallback_run(**changes: Any) -> dict[str, Any]:
    run = {
        "ready": True,
        "fallback_reason": sc.fallback_reason(FALLBACK),
        "attention": "reference",
        "model_traceback": False,
        "service_died": False,
        "model_starts": 1,
        "text": " Paris.\n\nThe answer is:",
        "output_ids": [7042, 30, 198, 198, 504, 2988, 314, 42],
        "completion_tokens": 8,
        "finish_reason": "length",
        "repeat_identical": True,
    }
    return {**run, **changes}


def test_judge_fallback_run() -> None:
    assert sc.judge_fallback_run(fallback_run(), None, "cuda", trained=True) == []
    assert sc.judge_fallback_run(fallback_run(text=" Lyon"), None, "cuda", True) == [
        "greedy text ' Lyon' does not say Paris"
    ]
    cpu_reason = "flashinfer unavailable (the KV pool is not on a CUDA device); using the ref"
    run = fallback_run(fallback_reason=cpu_reason + "erence attention")
    assert sc.judge_fallback_run(run, None, "cpu", True) == []
    assert "another reason" in sc.judge_fallback_run(run, None, "cuda", True)[0]
    problems = sc.judge_fallback_run(
        fallback_run(fallback_reason=None, attention="flashinfer", model_starts=2),
        None,
        "cuda",
        True,
    )
    assert problems == [
        "no attention_fallback warning in model.log",
        "engine_ready attention=flashinfer, expected reference",
        "a service died and was restarted",
    ]
    ref = {"output_ids": [9, 30]}
    assert sc.judge_fallback_run(fallback_run(), ref, "cuda", trained=False) == [
        "first token differs from the flashinfer run"
    ]
    assert sc.judge_fallback_run(fallback_run(), {"output_ids": [7042, 1]}, "cuda", False) == []


def test_merge_renders_the_startup_table(tmp_path: Path) -> None:
    doc = {
        "schema": 1,
        "part": "startup",
        "device": "NVIDIA H100 80GB HBM3 (79 GiB, 132 SMs)",
        "date": "2026-11-24T10:00:00+00:00",
        "rows": [
            {
                "table": "startup",
                "variant": "arch_gelu",
                "what": "a Llama config.json with a GELU MLP",
                "returncode": 2,
                "wall_s": 6.5,
                "message": "unsupported model architecture: a | b",
                "pass": True,
            },
            {
                "table": "startup",
                "variant": "flashinfer_missing",
                "what": "whole stack",
                "returncode": 0,
                "wall_s": 20.0,
                "message": "flashinfer unavailable",
                "fallback_run": {"text": " Paris."},
                "problems": ["x"],
                "pass": False,
            },
        ],
        "errors": [],
    }
    (tmp_path / "startup.json").write_text(json.dumps(doc))
    text = merge.render(merge.load([tmp_path]))
    assert "## Start-up errors (part startup)" in text
    assert "| arch_gelu | a Llama config.json with a GELU MLP | 2 | 6.5 | pass |" in text
    assert "unsupported model architecture: a / b" in text
    assert "FAIL: x" in text and "text ' Paris.'" in text
    assert "## Other" not in text


@pytest.mark.integration  # starts a process
def test_part_is_registered_and_imports_without_cuda() -> None:
    from radixmesh_bench.gpu import run

    assert "startup" in run.PARTS
    assert not torch.cuda.is_initialized()
    proc = subprocess.run(
        [sys.executable, "radixmesh_bench/gpu/run.py", "--help"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0 and "--part startup" in proc.stdout
