"""Tensor parallelism on CPU over gloo (issue 28): a tiny Llama (2 KV heads: one per rank) and
a tiny Qwen2 (1 KV head, q/k/v biases, tied embeddings: the KV head replicated on both ranks)
served with `--tp 2` give token-identical output to `--tp 1` (fp32, random weights of one
seed), through the whole stack: chunked prefill (64-token chunks of a ~400-token prompt), radix
reuse (a second prompt on the same prefix, cached), constrained decoding (regex and JSON
schema) and seeded sampling. Then, under load, a kill -9 of one rank: the group goes down as
one model-service loss, the launcher restarts it, and every request completes identical
(continuations); a kill -9 of rank 0 leaves no orphan rank behind.

Stacks run one at a time (TP1 for the reference, then TP2), each with its own processes."""

from __future__ import annotations

import os
import time
from collections.abc import Generator, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import grpc
import pytest
from radixmesh.api import Client, GenerateResult, RadixMeshError

from tests.conftest import Stack, start_stack

pytestmark = pytest.mark.integration

TIMEOUT = 300.0
NEW = 12
PREFIX = " ".join(f"item {i} is {i * 7 % 13};" for i in range(60))  # ~420 tokens
WORKLOAD: list[tuple[str, dict[str, Any]]] = [
    (PREFIX + " The first", {"temperature": 0}),
    (PREFIX + " The second", {"temperature": 0}),  # same prefix: radix reuse
    ("Answer:", {"regex": "(yes|no|maybe)[.!]", "temperature": 0}),
    ("A number:", {"json_schema": {"type": "integer"}, "temperature": 0}),
    ("Once upon a time", {"temperature": 0.8, "seed": 11}),
    ("def f(x):", {"temperature": 0}),
]
MODELS = {
    # Vocabulary and end token of the stack's tokenizer (SmolLM2's) so text round-trips.
    "llama": "tiny-llama:vocab_size=49152,eos_token_id=2",
    "qwen2": "tiny-qwen2:vocab_size=49152,eos_token_id=2",
}


def _stack(tmp: Path, model_dir: Path, spec: str, tp: int) -> Generator[Stack, None, None]:
    return start_stack(
        tmp,
        [
            *("--random-weights", spec, "--tokenizer", str(model_dir)),
            *("--kv-tokens", "4096", "--tp", str(tp)),
        ],
        ["--debug-invariants", "--chunk-tokens", "64", "--model-probe-s", "0.5"],
    )


def _wait_grammar_link(c: Client) -> None:
    deadline = time.monotonic() + 120
    while True:
        try:
            c.generate("Answer:", regex="(yes|no)", max_new_tokens=2, temperature=0)
            return
        except RadixMeshError as exc:
            if exc.code != grpc.StatusCode.UNAVAILABLE or time.monotonic() > deadline:
                raise
            time.sleep(0.2)


def _run(c: Client) -> list[GenerateResult]:
    return [c.generate(p, max_new_tokens=NEW, ignore_eos=True, **kw) for p, kw in WORKLOAD]


@pytest.fixture(scope="module", params=sorted(MODELS))
def model(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture(scope="module")
def reference(
    model: str, tmp_path_factory: pytest.TempPathFactory, model_dir: Path
) -> list[GenerateResult]:
    """The workload on `--tp 1`, in a stack of its own that is gone before TP2 starts."""
    gen = _stack(tmp_path_factory.mktemp(f"tp1-{model}"), model_dir, MODELS[model], 1)
    st = next(gen)
    try:
        with Client(st.endpoint, timeout=TIMEOUT) as c:
            _wait_grammar_link(c)
            return _run(c)
    finally:
        gen.close()


@pytest.fixture(scope="module")
def tp2(
    model: str,
    reference: list[GenerateResult],
    tmp_path_factory: pytest.TempPathFactory,
    model_dir: Path,
) -> Iterator[Stack]:
    gen = _stack(tmp_path_factory.mktemp(f"tp2-{model}"), model_dir, MODELS[model], 2)
    st = next(gen)
    try:
        with Client(st.endpoint, timeout=TIMEOUT) as c:
            _wait_grammar_link(c)
        yield st
    finally:
        gen.close()


def _check_identical(got: list[GenerateResult], ref: list[GenerateResult]) -> None:
    for i, (g, r) in enumerate(zip(got, ref, strict=True)):
        assert g.output_ids == r.output_ids, (i, WORKLOAD[i])
        assert g.finish_reason == r.finish_reason


def _children(pid: int) -> list[int]:
    with open(f"/proc/{pid}/task/{pid}/children") as f:
        return [int(p) for p in f.read().split()]


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie (exited, not yet reaped by its parent) counts as gone.
    with open(f"/proc/{pid}/stat") as f:
        return f.read().rsplit(")", 1)[1].split()[0] != "Z"


def _until(cond, timeout: float) -> bool:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cond():
            return True
        time.sleep(0.05)
    return bool(cond())


def test_tp2_matches_tp1_token_for_token(tp2: Stack, reference: list[GenerateResult]) -> None:
    with Client(tp2.endpoint, timeout=TIMEOUT) as c:
        got = _run(c)
    _check_identical(got, reference)
    assert got[1].cached_tokens >= 256, "the second prompt did not reuse the first's prefix"
    assert got[2].text in {"yes.", "yes!", "no.", "no!", "maybe.", "maybe!"}
    int(got[3].text)  # the schema held
    # The group is one service of two processes: rank 0 (the launcher's) and one child.
    assert len(_children(tp2.launcher.procs["model"].pid)) == 1


def _under_load(st: Stack, ref: list[GenerateResult], act) -> None:  # type: ignore[no-untyped-def]
    """Every workload request streaming at once; `act` once each has tokens; all identical."""
    progress = [0] * len(WORKLOAD)

    def one(i: int) -> GenerateResult:
        p, kw = WORKLOAD[i]
        for item in c.stream(p, max_new_tokens=NEW, ignore_eos=True, **kw):
            if isinstance(item, GenerateResult):
                return item
            progress[i] += len(item.token_ids)
        raise AssertionError("stream ended without a result")

    with Client(st.endpoint, timeout=TIMEOUT) as c, ThreadPoolExecutor(len(WORKLOAD)) as pool:
        futs = [pool.submit(one, i) for i in range(len(WORKLOAD))]
        assert _until(lambda: min(progress) >= 1, 120), progress
        act()
        got = [f.result(timeout=TIMEOUT) for f in futs]
    _check_identical(got, ref)


def test_kill9_of_rank1_under_load_every_request_completes_identical(
    tp2: Stack, reference: list[GenerateResult]
) -> None:
    restarts = tp2.launcher.restarts["model"]
    rank0 = tp2.launcher.procs["model"].pid
    (rank1,) = _children(rank0)
    _under_load(tp2, reference, lambda: os.kill(rank1, 9))
    assert tp2.launcher.restarts["model"] == restarts + 1  # one model-service loss
    assert not _alive(rank0)


def test_kill9_of_rank0_leaves_no_orphan_rank(tp2: Stack, reference: list[GenerateResult]) -> None:
    rank0 = tp2.launcher.procs["model"].pid
    (rank1,) = _children(rank0)
    _under_load(tp2, reference, lambda: tp2.launcher.kill("model"))
    assert _until(lambda: not _alive(rank1), 10), "rank 1 outlived rank 0"
