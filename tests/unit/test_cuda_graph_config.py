"""`--cuda-graph-max-bs` (ModelServiceConfig.cuda_graph_max_bs, env RADIXMESH_CUDA_GRAPH_MAX_BS
through the config system): the batch-size buckets it gives, and the engine passing it to
`capture_decode_graphs`. Runs on CPU: the capture itself is replaced by a recorder."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from model_service import cuda_graphs
from model_service import engine as engine_mod
from model_service.config import ModelServiceConfig
from model_service.cuda_graphs import DEFAULT_BUCKETS, buckets_up_to, capture_decode_graphs
from services.config import parse_config
from tests.unit.test_model_startup import tiny_folder

ENV = "RADIXMESH_CUDA_GRAPH_MAX_BS"


@pytest.mark.parametrize(
    ("max_bs", "buckets"),
    [
        (128, list(DEFAULT_BUCKETS)),
        (0, []),
        (-3, []),
        (1, [1]),
        (3, [1, 2, 3]),
        (8, [1, 2, 4, 8]),
        (100, [1, 2, 4, 8, 12, 16, 24, 32, 48, 64, 96, 100]),
        (256, [*DEFAULT_BUCKETS, 256]),
        (512, [*DEFAULT_BUCKETS, 512]),
    ],
)
def test_buckets_up_to(max_bs: int, buckets: list[int]) -> None:
    assert buckets_up_to(max_bs) == buckets


def test_default_is_128_and_the_flag_and_env_var_reach_the_config(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv(ENV, raising=False)
    assert parse_config(ModelServiceConfig, []).cuda_graph_max_bs == 128
    assert ModelServiceConfig().cuda_graph_max_bs == 128
    assert parse_config(ModelServiceConfig, ["--cuda-graph-max-bs", "256"]).cuda_graph_max_bs == 256
    monkeypatch.setenv(ENV, "0")
    assert parse_config(ModelServiceConfig, []).cuda_graph_max_bs == 0
    # the command line wins over the environment
    assert parse_config(ModelServiceConfig, ["--cuda-graph-max-bs", "64"]).cuda_graph_max_bs == 64
    with pytest.raises(ValueError, match="--cuda-graph-max-bs must be >= 0"):
        parse_config(ModelServiceConfig, ["--cuda-graph-max-bs", "-1"])


def test_zero_turns_graphs_off_without_touching_the_model() -> None:
    # no model, no attention backend: with no buckets nothing is built or captured
    assert capture_decode_graphs(None, None, 0, 0, max_bs=0) is None  # type: ignore[arg-type]
    assert capture_decode_graphs(None, None, 0, 0, buckets=[]) is None  # type: ignore[arg-type]


@pytest.mark.parametrize(("argv", "expect"), [([], 128), (["--cuda-graph-max-bs", "24"], 24)])
def test_engine_passes_the_flag_to_the_capture(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, argv: list[str], expect: int
) -> None:
    """The engine captures graphs only behind flashinfer attention: a stand-in backend named
    flashinfer and a recording capture show what the engine asks for."""
    monkeypatch.delenv(ENV, raising=False)
    seen: dict[str, Any] = {}

    def fake_choose(choice: str, pool: Any, *shape: int) -> tuple[Any, str]:
        return SimpleNamespace(name="flashinfer", pool=pool), ""

    def fake_capture(model: Any, attn: Any, **kw: Any) -> Any:
        seen.update(kw)
        return SimpleNamespace(buckets=buckets_up_to(kw["max_bs"]))

    monkeypatch.setattr(engine_mod, "choose_attention", fake_choose)
    monkeypatch.setattr(cuda_graphs, "capture_decode_graphs", fake_capture)
    monkeypatch.setattr(engine_mod, "ModelRunner", lambda *a, **k: SimpleNamespace(**k))
    folder = str(tiny_folder(tmp_path))
    cfg = parse_config(ModelServiceConfig, ["--model", folder, "--device", "cpu", *argv])
    eng = engine_mod.build_engine(cfg)
    assert seen["max_bs"] == expect
    assert eng.runner.decode_graphs is not None
    assert eng.runner.decode_graphs.buckets == buckets_up_to(expect)
