"""Start-up errors of the model service (issue 4): each case ends `python -m model_service` with
exit code 2 and one `startup_failed` line that says what is wrong and what to do; flashinfer that
cannot run falls back to the reference attention with a warning. Tiny model folders are written
to tmp_path; CUDA-only cases monkeypatch the memory probe and torch.cuda."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any, TextIO, cast

import pytest
import structlog
import torch
from safetensors.torch import save_file

import model_service.__main__ as main_mod
from model_service import engine as engine_mod
from model_service import preflight
from model_service.__main__ import main
from model_service.attention import flashinfer as fi
from model_service.config import ModelServiceConfig
from model_service.engine import build_engine
from model_service.models.llama import LlamaArgs, LlamaForCausalLM
from model_service.random_configs import config_dict, hf_config
from services.config import parse_config
from services.logging import configure_logging
from services.model_store import ModelError

ROOT = Path(__file__).resolve().parents[2]
TINY = {
    "model_type": "llama",
    "architectures": ["LlamaForCausalLM"],
    "hidden_size": 32,
    "intermediate_size": 64,
    "num_hidden_layers": 1,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "vocab_size": 128,
    "max_position_embeddings": 256,
    "rms_norm_eps": 1e-5,
    "hidden_act": "silu",
    "tie_word_embeddings": False,
}


class _CurrentStderr:
    """Writes to whatever sys.stderr is at the time (pytest swaps it for every test)."""

    def write(self, text: str) -> int:
        return sys.stderr.write(text)

    def flush(self) -> None:
        sys.stderr.flush()


@pytest.fixture(autouse=True)
def logging_to_current_stderr(monkeypatch: pytest.MonkeyPatch) -> None:
    """main() configures structlog for the service; keep that, but never bind a logger to one
    test's captured stderr (a later test would write to a closed file)."""

    def configure(service: str, level: str = "info", json: bool = False) -> None:
        configure_logging(service, level, json)
        structlog.configure(
            # PrintLogger only calls write() and flush(), which _CurrentStderr forwards.
            logger_factory=structlog.PrintLoggerFactory(file=cast(TextIO, _CurrentStderr())),
            cache_logger_on_first_use=False,
        )

    monkeypatch.setattr(main_mod, "configure_logging", configure)
    # A start-up that wrongly succeeds must fail the test, not serve forever.
    monkeypatch.setattr(main_mod, "run", lambda *a, **k: pytest.fail("the service started"))
    configure("model-test")


def tiny_folder(tmp_path: Path, weights: bool = True, **changes: Any) -> Path:
    """An HF-format folder: config.json (TINY with `changes`) and random fp32 safetensors."""
    folder = tmp_path / "tiny"
    folder.mkdir()
    cfg = {**TINY, **changes}
    (folder / "config.json").write_text(json.dumps(cfg))
    if weights:
        args = LlamaArgs.from_hf_config(SimpleNamespace(**TINY))
        state = LlamaForCausalLM(args).state_dict()
        save_file({k: v.contiguous() for k, v in state.items()}, str(folder / "m.safetensors"))
    return folder


def startup_error(capsys: pytest.CaptureFixture[str], argv: list[str]) -> str:
    """Run the service's main() and return its log; it must exit with code 2."""
    with pytest.raises(SystemExit) as exc:
        main(["--device", "cpu", *argv])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    lines = [ln for ln in err.splitlines() if "startup_failed" in ln]
    assert len(lines) == 1, err
    return lines[0]


# -- unsupported architecture ---------------------------------------------------------------
@pytest.mark.parametrize(
    ("changes", "expect"),
    [
        ({"hidden_act": "gelu"}, "hidden_act 'gelu'"),
        ({"architectures": ["LlamaForSequenceClassification"]}, "LlamaForSequenceClassification"),
        ({"rope_scaling": {"rope_type": "yarn", "factor": 4.0}}, "rope type 'yarn'"),
        ({"mlp_bias": True}, "mlp_bias"),
        ({"num_key_value_heads": 3}, "not a multiple of 3 KV heads"),
    ],
)
def test_unsupported_architecture_exits_2_naming_what_is_supported(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], changes: dict[str, Any], expect: str
) -> None:
    line = startup_error(capsys, ["--model", str(tiny_folder(tmp_path, **changes))])
    assert "unsupported model architecture" in line
    assert expect in line
    assert "LlamaForCausalLM, Qwen2ForCausalLM" in line


def test_check_architecture_accepts_llama_qwen2_and_the_random_8b() -> None:
    preflight.check_architecture(SimpleNamespace(**TINY))
    preflight.check_architecture(
        SimpleNamespace(**{**TINY, "model_type": "qwen2", "architectures": ["Qwen2ForCausalLM"]})
    )
    preflight.check_architecture(hf_config(config_dict("llama-3.1-8b")))
    with pytest.raises(ModelError, match="sliding-window"):
        preflight.check_architecture(SimpleNamespace(**TINY, use_sliding_window=True))


@pytest.mark.integration  # starts a process
def test_other_model_type_fails_cleanly_as_a_process(tmp_path: Path) -> None:
    folder = tiny_folder(tmp_path, weights=False, model_type="mistral")
    proc = subprocess.run(
        [sys.executable, "-m", "model_service", "--model", str(folder), "--device", "cpu"],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
    )
    assert proc.returncode == 2, proc.stderr
    assert "model_type 'mistral' is not supported" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_checkpoint_without_safetensors_exits_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    line = startup_error(capsys, ["--model", str(tiny_folder(tmp_path, weights=False))])
    assert "no *.safetensors files" in line


# -- weights that do not fit ----------------------------------------------------------------
def test_param_count_matches_the_model_and_llama_8b() -> None:
    for spec in ("tiny-llama", "llama-3.1-8b:num_hidden_layers=2"):
        args = LlamaArgs.from_hf_config(hf_config(config_dict(spec)))
        with torch.device("meta"):
            model = LlamaForCausalLM(args)
        assert preflight.param_count(args) == sum(p.numel() for p in model.parameters())
    qwen = LlamaArgs.from_hf_config(SimpleNamespace(**{**TINY, "model_type": "qwen2"}))
    with torch.device("meta"):
        model = LlamaForCausalLM(qwen)
    assert qwen.attention_bias
    assert preflight.param_count(qwen) == sum(p.numel() for p in model.parameters())
    full = LlamaArgs.from_hf_config(hf_config(config_dict("llama-3.1-8b")))
    assert preflight.param_count(full) == 8_030_261_248  # Meta's published figure


def test_weights_that_do_not_fit_exit_2_with_numbers(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(preflight, "free_memory", lambda device: (1 << 10, 8 << 30))
    line = startup_error(capsys, ["--model", str(tiny_folder(tmp_path))])
    assert "do not fit" in line
    assert "0.00 GiB of 8.00 GiB is free" in line


def test_random_8b_on_a_small_gpu_is_refused_before_allocating(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The 8B random build peaks in fp32 (32 GB): refused on a GPU with 24 GiB free."""
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device=None: (24 << 30, 40 << 30))
    args = LlamaArgs.from_hf_config(hf_config(config_dict("llama-3.1-8b")))
    cuda = torch.device("cuda")
    with pytest.raises(ModelError) as exc:
        preflight.check_weights_fit(args, torch.bfloat16, cuda, "random-llama-3.1-8b", True)
    msg = str(exc.value)
    assert "8.03 B parameters" in msg and "built in float32, then cast" in msg
    assert "24.00 GiB of 40.00 GiB is free" in msg and "num_hidden_layers" in msg
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device=None: (79 << 30, 80 << 30))
    preflight.check_weights_fit(args, torch.bfloat16, cuda, "random-llama-3.1-8b", True)


def test_out_of_memory_while_loading_exits_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    def oom(*args: Any, **kwargs: Any) -> None:
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")

    monkeypatch.setattr(engine_mod, "load_model", oom)
    line = startup_error(capsys, ["--model", str(tiny_folder(tmp_path))])
    assert "out of memory while building the weights" in line
    assert "Tried to allocate 2.00 GiB" in line


# -- KV budget too small for one request ----------------------------------------------------
def test_kv_budget_below_one_request_exits_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # 128 B per token (1 layer x 2 KV heads x 8 dims x k+v x fp32): 10 KiB hold 80 tokens,
    # one request needs min(context 256, 4096) = 256.
    folder = str(tiny_folder(tmp_path))
    line = startup_error(capsys, ["--model", folder, "--kv-memory-gb", str(10 / (1 << 20))])
    assert "KV budget too small for one request" in line
    assert "holds 80 tokens at 128 B each, fewer than the 256 tokens" in line
    assert "--kv-memory-gb" in line


def test_min_kv_tokens_and_explicit_kv_tokens_are_honoured(tmp_path: Path) -> None:
    folder = str(tiny_folder(tmp_path))
    small = ["--model", folder, "--device", "cpu", "--kv-memory-gb", str(10 / (1 << 20))]
    eng = build_engine(parse_config(ModelServiceConfig, [*small, "--min-kv-tokens", "64"]))
    assert eng.runner.pool.capacity == 80
    with pytest.raises(ModelError, match="fewer than the 100 tokens"):
        build_engine(parse_config(ModelServiceConfig, [*small, "--min-kv-tokens", "100"]))
    # --kv-tokens sizes the pool outright (tests run small pools on purpose)
    eng = build_engine(parse_config(ModelServiceConfig, [*small, "--kv-tokens", "32"]))
    assert eng.runner.pool.capacity == 32


def test_explicit_kv_tokens_beyond_free_gpu_memory_is_refused(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device=None: (1 << 30, 80 << 30))
    with pytest.raises(ModelError, match=r"--kv-tokens 100000 needs 12\.21 GiB"):
        preflight.check_kv_fits(100_000, 131072, torch.device("cuda"))
    preflight.check_kv_fits(8000, 131072, torch.device("cuda"))


def test_out_of_memory_guard_passes_other_errors_through() -> None:
    cpu = torch.device("cpu")
    with (
        pytest.raises(ValueError, match="not memory"),
        preflight.out_of_memory_as_model_error("x", cpu, "y"),
    ):
        raise ValueError("not memory")
    with (
        pytest.raises(ModelError, match="out of memory while allocating"),
        preflight.out_of_memory_as_model_error("allocating", cpu, "hint"),
    ):
        raise RuntimeError("DefaultCPUAllocator: can't allocate memory: you tried 9 GB")


# -- flashinfer missing or failing: warning + reference path --------------------------------
def fake_cuda_pool() -> Any:
    """A pool that says it lives on CUDA (only device and dtype are read before the choice)."""
    k = SimpleNamespace(device=torch.device("cuda"), dtype=torch.bfloat16, shape=(2, 17, 2, 64))
    return SimpleNamespace(k=k, v=k, nan_fill=False)


def test_flashinfer_import_failure_falls_back_to_reference(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setitem(sys.modules, "flashinfer", None)  # `import flashinfer` raises
    for choice in ("auto", "flashinfer"):
        attn, note = fi.choose_attention(choice, fake_cuda_pool(), 4, 2, 64)
        assert attn.name == "reference"
        assert "flashinfer does not import" in note and "using the reference attention" in note


def test_flashinfer_failing_at_warm_up_falls_back_to_reference(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    calls: list[str] = []

    class Broken:
        def __init__(self, pool: Any, nh: int, nkv: int, hd: int) -> None:
            self.pool, self.nh, self.nkv, self.hd = pool, nh, nkv, hd
            self.device, self.dtype = torch.device("cpu"), torch.float32

        def plan(self, rows: Any, out_slots: Any) -> None:
            calls.append("plan")
            raise RuntimeError("no kernel for head_dim 96")

    monkeypatch.setattr(fi, "flashinfer_available", lambda: (True, ""))
    monkeypatch.setattr(fi, "FlashInferAttention", Broken)
    attn, note = fi.choose_attention("auto", fake_cuda_pool(), 4, 2, 96)
    assert calls == ["plan"]  # the warm-up ran the kernels before any request could
    assert attn.name == "reference"
    assert "flashinfer failed to start" in note and "head_dim 96" in note


def test_explicit_flashinfer_on_cpu_starts_with_the_reference_and_a_warning(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    warnings: list[tuple[str, dict[str, Any]]] = []

    class Recorder:
        def warning(self, event: str, **kw: Any) -> None:
            warnings.append((event, kw))

        def info(self, event: str, **kw: Any) -> None:
            pass

    monkeypatch.setattr(engine_mod, "log", Recorder())
    argv = ["--model", str(tiny_folder(tmp_path)), "--device", "cpu", "--attention", "flashinfer"]
    assert build_engine(parse_config(ModelServiceConfig, argv)).attention_backend == "reference"
    assert [e for e, _ in warnings] == ["attention_fallback"]
    assert "not on a CUDA device" in warnings[0][1]["reason"]


# -- tensor parallelism ----------------------------------------------------------------------
def test_tp_that_does_not_split_the_model_exits_2_before_any_rank_starts(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from model_service.tp import group

    monkeypatch.setattr(group, "start_children", lambda *a: pytest.fail("a rank was started"))
    line = startup_error(capsys, ["--model", str(tiny_folder(tmp_path)), "--tp", "3"])
    assert "--tp 3 cannot split this model: 4 attention heads" in line
    assert "2 KV heads" in line and "MLP width 64" in line  # every reason is named


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--tp", "2", "--gpus", "0"], "--gpus 0 names 1 GPUs for --tp 2: give one per rank"),
        (["--tp", "2", "--device", "cuda:1"], "--tp > 1 places ranks with --gpus"),
        (["--gpus", "0,0", "--tp", "2"], "--gpus '0,0' names a GPU twice"),
        (["--tp", "0"], "--tp must be >= 1"),
    ],
)
def test_tp_flags_that_contradict_each_other_are_refused(argv: list[str], message: str) -> None:
    with pytest.raises(ValueError) as exc:
        parse_config(ModelServiceConfig, argv)
    assert message in str(exc.value)
