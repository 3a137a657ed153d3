"""Tensor parallelism on GPUs (needs 2; skipped otherwise, so CPU CI skips the file): the
same random model served at `--tp 2` (NCCL) and `--tp 1`, through the whole stack.

- fp32, reference attention, no CUDA graphs: TP2 gives TP1's greedy tokens exactly (the
  all-reduce only changes summation order; fp32 random weights have no near-ties).
- bf16, flashinfer, CUDA graphs on (the decode graphs capture the all-reduces and the logits
  all-gather): both services report captured buckets, and the greedy agreement with TP1 is
  printed (rate and first divergence per prompt; bf16 random weights have near-ties) and
  must stay high.
Run: `python -m pytest -q -s tests/gpu/test_tp_gpu.py` on a machine with two GPUs.
"""

from __future__ import annotations

import json
from collections.abc import Generator
from pathlib import Path

import pytest
import torch

if torch.cuda.device_count() < 2:
    pytest.skip("tensor parallelism needs 2 CUDA GPUs", allow_module_level=True)

from radixmesh.api import Client, GenerateResult  # noqa: E402

from tests.conftest import Stack, start_stack  # noqa: E402

MODEL = "llama-3.1-8b:num_hidden_layers=4,vocab_size=49152,eos_token_id=2"
PROMPTS = [f"Prompt {i}: " + "the quick brown fox " * (1 + 7 * i) for i in range(8)]
NEW = 48


def _stack(tmp: Path, model_dir: Path, tp: int, extra: list[str]) -> Generator[Stack, None, None]:
    return start_stack(
        tmp,
        ["--random-weights", MODEL, "--tokenizer", str(model_dir), "--tp", str(tp), *extra],
    )


def _greedy(tmp: Path, model_dir: Path, tp: int, extra: list[str]) -> list[GenerateResult]:
    gen = _stack(tmp, model_dir, tp, extra)
    st = next(gen)
    try:
        with Client(st.endpoint, timeout=600) as c:
            out = [
                c.generate(p, max_new_tokens=NEW, ignore_eos=True, temperature=0) for p in PROMPTS
            ]
        log = (st.log_dir / "model.log").read_text()
        buckets = [ln for ln in log.splitlines() if "engine_ready" in ln]
        assert len(buckets) == tp, f"{tp} ranks should each log engine_ready: {buckets}"
        if "--cuda-graph-max-bs" not in extra:
            assert all("cuda_graph_buckets=[]" not in ln for ln in buckets), buckets
        return out
    finally:
        gen.close()


def test_tp2_fp32_reference_is_token_identical(tmp_path: Path, model_dir: Path) -> None:
    extra = ["--dtype", "float32", "--attention", "reference", "--cuda-graph-max-bs", "0"]
    one = _greedy(tmp_path / "tp1", model_dir, 1, extra)
    two = _greedy(tmp_path / "tp2", model_dir, 2, extra)
    assert [r.output_ids for r in two] == [r.output_ids for r in one]


def test_tp2_bf16_cuda_graphs_agreement(tmp_path: Path, model_dir: Path) -> None:
    extra = ["--dtype", "bfloat16", "--kv-tokens", "65536"]
    one = _greedy(tmp_path / "tp1", model_dir, 1, extra)
    two = _greedy(tmp_path / "tp2", model_dir, 2, extra)
    pairs = [
        list(zip(a.output_ids, b.output_ids, strict=True)) for a, b in zip(one, two, strict=True)
    ]
    same = sum(x == y for p in pairs for x, y in p)
    first_div = [next((i for i, (x, y) in enumerate(p) if x != y), NEW) for p in pairs]
    rate = same / (NEW * len(PROMPTS))
    print(json.dumps({"tp2_vs_tp1_bf16_agreement": rate, "first_divergence": first_div}))
    # Divergence starts only at a near-tie; the first tokens of most prompts must agree.
    assert sum(d > 0 for d in first_div) >= len(PROMPTS) - 1, first_div
