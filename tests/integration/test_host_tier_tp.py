"""The host KV tier with tensor parallelism (issue 31): every rank runs the step's KV copies on
its own KV heads, so `--tp 2` with a tiny GPU pool and a host tier gives the same tokens as
`--tp 1` with a pool that never evicts (fp32, random weights of one seed: the TP test's
models, tests/integration/test_tp.py)."""

from __future__ import annotations

from collections.abc import Generator
from pathlib import Path

import pytest
from radixmesh.api import Client, GenerateResult

from radixmesh_wire.pb import api_pb2
from tests.conftest import Stack, start_stack

pytestmark = pytest.mark.integration

TIMEOUT = 300.0
MODEL = "tiny-llama:vocab_size=49152,eos_token_id=2"
GPU_KV, HOST_KV, BIG_KV = 192, 2048, 4096
NEW = 6


def _stack(tmp: Path, model_dir: Path, tp: int, kv: int, host: int) -> Generator[Stack, None, None]:
    tier = ["--host-kv-tokens", str(host)] if host else []
    return start_stack(
        tmp,
        [
            *("--random-weights", MODEL, "--tokenizer", str(model_dir)),
            *("--kv-tokens", str(kv), "--tp", str(tp), *tier),
        ],
        ["--debug-invariants", "--model-probe-s", "0.5", *tier],
    )


def _run(c: Client) -> list[GenerateResult]:
    """Four conversations, two turns each, interleaved: the second turns find their history
    evicted from the small GPU pool."""
    hist = [
        c.tokenize(f"Log {j}: " + " ".join(f"item {i} is {i * (j + 3) % 17};" for i in range(14)))
        for j in range(4)
    ]
    out = []
    for _ in range(2):
        for j in range(4):
            r = c.generate(input_ids=hist[j], max_new_tokens=NEW, temperature=0, ignore_eos=True)
            out.append(r)
            hist[j] = hist[j] + r.output_ids + c.tokenize(" Next:")
    return out


def _serve(
    tmp: Path, model_dir: Path, tp: int, kv: int, host: int
) -> tuple[list[GenerateResult], api_pb2.Stats]:
    gen = _stack(tmp, model_dir, tp, kv, host)
    st = next(gen)
    try:
        with Client(st.endpoint, timeout=TIMEOUT) as c:
            return _run(c), c.stats()
    finally:
        gen.close()


def test_tp2_host_tier_matches_tp1_unlimited(
    tmp_path_factory: pytest.TempPathFactory, model_dir: Path
) -> None:
    want, _ = _serve(tmp_path_factory.mktemp("tp1-big"), model_dir, 1, BIG_KV, 0)
    got, stats = _serve(tmp_path_factory.mktemp("tp2-tier"), model_dir, 2, GPU_KV, HOST_KV)
    for i, (g, w) in enumerate(zip(got, want, strict=True)):
        assert g.output_ids == w.output_ids, f"request {i}"
        assert g.cached_tokens == w.cached_tokens, f"request {i}"
    assert stats.host_hit_tokens > 0 and stats.host_saved_tokens > 0
